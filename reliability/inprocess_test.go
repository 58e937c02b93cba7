package reliability_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/dedupkit/dedup/internal/crashtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// logBuffer collects the text logs of in-process consumers, printed when the
// test fails.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// count returns how many log lines contain s.
func (b *logBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), s)
}

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// dumpOnFailure prints the logs' last lines, but for the expected dead
// letters, if t failed.
func (b *logBuffer) dumpOnFailure(t *testing.T) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		var lines []string
		for _, l := range strings.Split(b.buf.String(), "\n") {
			if l != "" && !strings.Contains(l, "message dead-lettered") {
				lines = append(lines, l)
			}
		}
		if len(lines) > 60 {
			lines = lines[len(lines)-60:]
		}
		t.Logf("consumer logs (last %d lines):\n%s", len(lines), strings.Join(lines, "\n"))
	})
}

// consumers is a group of in-process kafkadedup.Consumers.
type consumers struct {
	cancel context.CancelFunc
	done   []chan error
}

// startConsumers runs n consumers of the group over the wrappers newWrapper
// returns, with the same group timing as the worker processes.
func startConsumers(t *testing.T, k *kafka, group string, n int, log *slog.Logger, newWrapper func(i int) *dedup.Wrapper[*kgo.Record]) *consumers {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cs := &consumers{cancel: cancel}
	for i := range n {
		c, err := kafkadedup.NewConsumer(newWrapper(i),
			kafkadedup.WithLogger(log.With(slog.Int("consumer", i+1))),
			kafkadedup.WithMaxPollRecords(50), // as the worker processes, see there
			kafkadedup.WithErrorBackoff(dedup.ExponentialBackoff(50*time.Millisecond, 500*time.Millisecond)),
			kafkadedup.WithClientOpts(k.clientOpts(group)...))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		cs.done = append(cs.done, done)
	}
	t.Cleanup(func() { cs.stop(t) })
	return cs
}

// stop stops the consumers and fails t if one does not return within
// crashtest.Stall or returns an error; it may be called again.
func (cs *consumers) stop(t *testing.T) {
	t.Helper()
	cs.cancel()
	for i, done := range cs.done {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("consumer %d: Run: %v", i+1, err)
			}
		case <-time.After(crashtest.Stall):
			t.Errorf("consumer %d did not stop within %v", i+1, crashtest.Stall)
		}
	}
	cs.done = nil
}

// wrapOpts are the wrapper options of the in-process campaigns.
func wrapOpts(scope string, sink dedup.Sink, st *settled, log *slog.Logger, lease time.Duration) []dedup.Opt {
	return []dedup.Opt{
		dedup.WithScope(scope),
		dedup.WithSink(sink),
		dedup.WithMaxAttempts(5),
		dedup.WithBackoff(dedup.ExponentialBackoff(10*time.Millisecond, 50*time.Millisecond)),
		dedup.WithLease(lease),
		dedup.WithLogger(log),
		dedup.WithObserver(st.observe),
	}
}

// memEffects counts effects applied in memory, per event, by consumer.
type memEffects struct {
	mu   sync.Mutex
	rows map[string][]string
}

func (m *memEffects) apply(id, by string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rows == nil {
		m.rows = map[string][]string{}
	}
	m.rows[id] = append(m.rows[id], by)
}

func (m *memEffects) snapshot() map[string][]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string][]string, len(m.rows))
	for k, v := range m.rows {
		out[k] = append([]string(nil), v...)
	}
	return out
}

// privatePool returns a pool on a private PostgreSQL server, closed when t
// ends.
func privatePool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// count returns how many events have a durable outcome.
func (s *settled) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

// checkEnd fails t unless the campaign lost nothing, dead-lettered only
// poison and applied nothing twice; it logs the figures.
func checkEnd(t *testing.T, name string, fig figures, twice []string, violations []string) {
	t.Helper()
	t.Logf("%s: %v", name, fig)
	if fig.lost != 0 || fig.goodDeadLettered != 0 || fig.poisonApplied != 0 {
		t.Errorf("lost %d events, dead-lettered %d good events, applied %d poison events; want none",
			fig.lost, fig.goodDeadLettered, fig.poisonApplied)
	}
	if fig.appliedTwice != 0 {
		t.Errorf("%d events applied twice, want 0: %s", fig.appliedTwice, strings.Join(twice, ", "))
	}
	if len(violations) > 0 {
		t.Errorf("%d records committed before they were settled, e.g. %s", len(violations), violations[0])
	}
	if fig.deadLettered != fig.poison+fig.crashers {
		t.Errorf("%d events dead-lettered, want the %d poison events", fig.deadLettered, fig.poison+fig.crashers)
	}
}
