package amqpdedup_test

import (
	"context"
	"slices"
	"strconv"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/amqpdedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// Under a backlog, batches fill up to the batch size however the
// deliveries trickle out of amqp091-go, and a delivery that arrives while
// no batch is being handled is handled at once, alone. The linger is
// longer than the test may take, so every batch but the first is handed
// over because it is full: the first delivery goes alone (nothing was
// being handled), its handler holds it until the 200 after it are
// processed, and those, through a prefetch of 40, form ten claims of 20.
func TestBacklogFormsFullBatches(t *testing.T) {
	for _, kind := range queueKinds {
		t.Run(kind, func(t *testing.T) {
			b := newBroker(t)
			q := b.queue(kind)
			const size, batches = 20, 10
			const n = 1 + size*batches
			for i := range n {
				b.publish(q, "backlog-"+strconv.Itoa(i), "x", nil)
			}
			store := adaptertest.NewClaimSizes(dedup.NewMemoryStore())
			got := adaptertest.NewEffects()
			release := make(chan struct{})
			c := b.consumerAt(b.url, q, store, func(ctx context.Context, d amqp.Delivery) error {
				if d.MessageId == "backlog-0" {
					select {
					case <-release:
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				got.Apply(d.MessageId)
				return nil
			}, []amqpdedup.Opt{amqpdedup.WithPrefetch(2 * size), amqpdedup.WithBatchSize(size),
				amqpdedup.WithLinger(3 * effectDeadline)})
			stop := run(t, c)
			adaptertest.WaitFor(t, effectDeadline, "every event behind the first applied", func() bool { return got.Applied() == n-1 })
			close(release)
			adaptertest.WaitFor(t, effectDeadline, "the first event applied and every delivery acknowledged", func() bool {
				return got.Applied() == n && b.depth(q) == 0
			})
			stop()
			want := []int{1} // in any order: the batches are handled at once
			for range batches {
				want = append(want, size)
			}
			if sizes := store.Sizes(); !slices.Equal(sizes, want) {
				t.Errorf("claims of %v keys, want %v", sizes, want)
			}
			if twice := got.Twice(); len(twice) > 0 {
				t.Errorf("applied more than once: %v", twice)
			}
		})
	}
}
