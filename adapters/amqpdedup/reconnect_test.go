package amqpdedup_test

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/amqpdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// tries keeps the consumer's failed tries to consume: when each was
// logged, at which level, and the wait it announced.
type tries struct {
	mu     sync.Mutex
	at     []time.Time
	levels []slog.Level
	waits  []string
	backs  []string // the "after" of each INFO saying the queue is consumed again
}

func (l *tries) Enabled(context.Context, slog.Level) bool { return true }
func (l *tries) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *tries) WithGroup(string) slog.Handler            { return l }
func (l *tries) Handle(_ context.Context, r slog.Record) error {
	attrs := map[string]string{}
	r.Attrs(func(a slog.Attr) bool {
		attrs[a.Key] = a.Value.String()
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case strings.HasPrefix(r.Message, "amqpdedup: cannot consume the queue"):
		l.at, l.levels, l.waits = append(l.at, time.Now()), append(l.levels, r.Level), append(l.waits, attrs["retry_in"])
	case strings.HasPrefix(r.Message, "amqpdedup: consuming the queue again"):
		l.backs = append(l.backs, attrs["after"])
	}
	return nil
}

func (l *tries) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.at)
}

// The broker unreachable (a TCP proxy cut) for several tries: the consumer
// tries again every second at most, whatever its error backoff, logging
// the first failure at WARN and the next ones at DEBUG, and Health reports
// it; once the broker is reachable again, the next try consumes the queue
// (an INFO says after how long) and an event published then is applied.
func TestReconnectsWithinASecond(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	q := b.queue("quorum")
	u, err := amqp.ParseURI(b.url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.StartProxy(t, net.JoinHostPort(u.Host, strconv.Itoa(u.Port)))
	u.Host, u.Port = "127.0.0.1", mustPort(t, proxy.Addr())
	got := adaptertest.NewEffects()
	logs := &tries{}
	c := b.consumerAt(u.String(), q, dedup.NewMemoryStore(), func(_ context.Context, d amqp.Delivery) error {
		got.Apply(d.MessageId)
		return nil
	}, []amqpdedup.Opt{amqpdedup.WithLogger(slog.New(logs)),
		amqpdedup.WithErrorBackoff(dedup.ExponentialBackoff(time.Second, 30*time.Second))})
	run(t, c)
	b.publish(q, "before", "{}", nil)
	adaptertest.WaitFor(t, effectDeadline, "the first event applied", func() bool { return got.Count("before") == 1 })

	proxy.Cut()
	const failed = 6 // the error backoff would wait 1+2+4+8+16 s between these
	adaptertest.WaitFor(t, effectDeadline, "failed tries to consume", func() bool { return logs.count() >= failed })
	if err := c.Health(); err == nil || !strings.Contains(err.Error(), "not consuming queue") {
		t.Errorf("Health with the broker cut off: %v, want not consuming", err)
	}
	proxy.Restore()
	restored := time.Now()
	adaptertest.WaitFor(t, effectDeadline, "Health nil once the broker is back", func() bool { return c.Health() == nil })
	t.Logf("consuming again %v after the broker came back", time.Since(restored).Round(time.Millisecond))
	b.publish(q, "after", "{}", nil)
	adaptertest.WaitFor(t, effectDeadline, "an event published after the return applied", func() bool { return got.Count("after") == 1 })

	logs.mu.Lock()
	defer logs.mu.Unlock()
	for i, w := range logs.waits {
		d, err := time.ParseDuration(w)
		if err != nil || d <= 0 || d > time.Second {
			t.Errorf("try %d: retry_in %q, want a Go duration of 1s at most", i+1, w)
		}
	}
	if logs.levels[0] != slog.LevelWarn || logs.levels[1] != slog.LevelDebug {
		t.Errorf("levels of the first tries %v, want WARN then DEBUG", logs.levels[:2])
	}
	// A try under way when the proxy was restored may fail; the next one
	// must not.
	late := 0
	for _, at := range logs.at {
		if at.After(restored) {
			late++
		}
	}
	if late > 1 {
		t.Errorf("%d tries failed after the broker came back, want at most 1", late)
	}
	if len(logs.backs) != 1 {
		t.Fatalf("%d INFOs of consuming again, want 1", len(logs.backs))
	}
	if _, err := time.ParseDuration(logs.backs[0]); err != nil {
		t.Errorf("after %q: %v", logs.backs[0], err)
	}
}
