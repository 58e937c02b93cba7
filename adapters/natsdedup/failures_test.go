package natsdedup_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/natsdedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// naks keeps the nak delays (retry_in) the consumer logs for messages not
// acknowledged.
type naks struct {
	mu     sync.Mutex
	delays []time.Duration
}

func (n *naks) Enabled(context.Context, slog.Level) bool { return true }
func (n *naks) WithAttrs([]slog.Attr) slog.Handler       { return n }
func (n *naks) WithGroup(string) slog.Handler            { return n }
func (n *naks) Handle(_ context.Context, r slog.Record) error {
	if !strings.Contains(r.Message, "not acknowledged") {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "retry_in" {
			d, err := time.ParseDuration(a.Value.String()) // logged as a Go duration string
			if err != nil {
				panic(fmt.Sprintf("retry_in %q: %v", a.Value, err))
			}
			n.mu.Lock()
			n.delays = append(n.delays, d)
			n.mu.Unlock()
		}
		return true
	})
	return nil
}

// Only a settled message ends a run of failures: a retry between two
// messages not settled does not, so the second is naked with the second
// step of the failure backoff (1 s to 2 s, the first being 0.5 s to 1 s);
// after an acknowledgement, the next failure is the first again.
func TestOnlyASettledMessageEndsAFailureRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	cons := e.consumer(t, 5*time.Second)
	store := adaptertest.NewFaultyStore(dedup.NewMemoryStore())
	rec := adaptertest.NewEffects()
	var calls atomic.Int32
	applied := make(chan string, 2)
	w := wrap(t, store, rec, func(_ context.Context, m jetstream.Msg) error {
		if eventID(m) == "a" && calls.Add(1) == 1 {
			store.RefuseNext(1) // the retry's claim fails
			return errors.New("transient")
		}
		applied <- eventID(m)
		return nil
	})
	logs := &naks{}
	stop := start(t, cons, w, natsdedup.WithLogger(slog.New(logs)))
	for _, id := range []string{"a", "b"} {
		store.RefuseNext(1) // the first claim fails
		e.publish(t, id, id, nil)
		select {
		case got := <-applied:
			if got != id {
				t.Fatalf("applied %s, want %s", got, id)
			}
		case <-time.After(deadline):
			t.Fatalf("%s not applied", id)
		}
	}
	stop()
	logs.mu.Lock()
	defer logs.mu.Unlock()
	// a: refused (1st), retried, refused (2nd), applied; b: refused (1st), applied.
	d := logs.delays
	if len(d) != 3 || d[0] >= time.Second || d[1] < time.Second || d[2] >= time.Second {
		t.Errorf("nak delays %v, want the 1st step (under 1 s), the 2nd (1 s or more), the 1st", d)
	}
}
