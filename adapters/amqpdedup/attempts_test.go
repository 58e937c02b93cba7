package amqpdedup_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// A publisher's x-delivery-count (application code copying headers, a
// shovel) is not the broker's count. On a classic queue, which counts
// nothing, and on a quorum queue's first delivery, it is not read: a
// message published with x-delivery-count 99, whose handler fails
// transiently twice, is retried with attempts 1 then 2 and then applied,
// never dead-lettered.
func TestForgedDeliveryCountIsNotTrusted(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"classic", "quorum"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			b := newBroker(t)
			q := b.queue(kind)
			var retries retryLog
			var calls atomic.Int32
			applied := make(chan string, 1)
			c := b.consumer(q, dedup.NewMemoryStore(), func(_ context.Context, d amqp.Delivery) error {
				if calls.Add(1) <= 2 {
					return errors.New("transient")
				}
				applied <- d.MessageId
				return nil
			}, dedup.WithLogger(slog.New(&retries)), dedup.WithMaxAttempts(5))
			run(t, c)
			b.publish(q, "forged", "{}", amqp.Table{"x-delivery-count": int64(99)})
			adaptertest.WaitFor(t, effectDeadline, "the message applied or dead-lettered", func() bool {
				return len(applied) > 0 || b.depth(q+".dlq") > 0
			})
			adaptertest.WaitFor(t, effectDeadline, "the message acknowledged", func() bool { return b.depth(q) == 0 })
			if letters := b.letters(q + ".dlq"); len(letters) > 0 {
				t.Fatalf("dead-lettered: reason %q, attempts %q", header(letters[0], "dedup-reason"), header(letters[0], "dedup-attempts"))
			}
			if got, want := retries.attempts(), []int64{1, 2}; !slices.Equal(got, want) {
				t.Fatalf("retried with attempts %v, want %v", got, want)
			}
			if n := calls.Load(); n != 3 {
				t.Fatalf("handler called %d times, want 3", n)
			}
		})
	}
}

// retryLog records the attempt of each "attempt failed, will retry" the
// wrapper logs.
type retryLog struct {
	mu sync.Mutex
	n  []int64
}

func (l *retryLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *retryLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "dedup: attempt failed, will retry" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "attempt" {
			l.mu.Lock()
			l.n = append(l.n, a.Value.Int64())
			l.mu.Unlock()
		}
		return true
	})
	return nil
}
func (l *retryLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *retryLog) WithGroup(string) slog.Handler      { return l }

func (l *retryLog) attempts() []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.n)
}
