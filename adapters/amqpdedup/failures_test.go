package amqpdedup_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/amqpdedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// Only a settled delivery ends a run of failures: a retry between two
// deliveries not settled does not, so the second is held for the second
// step of WithErrorBackoff; after an acknowledgement, the next failure is
// the first again.
func TestOnlyASettledDeliveryEndsAFailureRun(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	q := b.queue("classic")
	store := adaptertest.NewFaultyStore(dedup.NewMemoryStore())
	var mu sync.Mutex
	var steps []int
	backoff := func(n int) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		steps = append(steps, n)
		return 20 * time.Millisecond
	}
	var calls atomic.Int32
	applied := make(chan string, 2)
	c := b.consumerAt(b.url, q, store, func(_ context.Context, d amqp.Delivery) error {
		if d.MessageId == "a" && calls.Add(1) == 1 {
			store.RefuseNext(1) // the retry's claim fails
			return errors.New("transient")
		}
		applied <- d.MessageId
		return nil
	}, []amqpdedup.Opt{amqpdedup.WithErrorBackoff(backoff)})
	run(t, c)
	for _, id := range []string{"a", "b"} {
		store.RefuseNext(1) // the first delivery's claim fails
		b.publish(q, id, "{}", nil)
		select {
		case got := <-applied:
			if got != id {
				t.Fatalf("applied %s, want %s", got, id)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s not applied within a minute", id)
		}
	}
	adaptertest.WaitFor(t, effectDeadline, "both acknowledged", func() bool { return b.depth(q) == 0 })
	mu.Lock()
	defer mu.Unlock()
	// a: refused (1), retried, refused (2), applied; b: refused (1), applied.
	if want := []int{1, 2, 1}; !slices.Equal(steps, want) {
		t.Errorf("backoff steps %v, want %v", steps, want)
	}
}
