package natsdedup_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/natsdedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// With the default options, a backlog is pulled and claimed in batches of
// DefaultBatchSize, several held at once: 300 messages waiting make three
// claims of 100 keys.
func TestBacklogClaimedInDefaultBatches(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	cons := e.consumer(t, 30*time.Second)
	const batches = 3
	const n = batches * natsdedup.DefaultBatchSize
	var ids []string
	for i := range n {
		ids = append(ids, "backlog-"+strconv.Itoa(i))
		e.publish(t, ids[i], "x", nil)
	}
	store := adaptertest.NewClaimSizes(dedup.NewMemoryStore())
	rec := adaptertest.NewEffects()
	start(t, cons, wrap(t, store, rec, func(_ context.Context, m jetstream.Msg) error {
		rec.Apply(eventID(m))
		return nil
	}))
	adaptertest.WaitFor(t, deadline, "every event applied", func() bool { return rec.Applied() == n })
	rec.AssertOnce(t, ids)
	assertAllAcked(t, cons)
	want := slices.Repeat([]int{natsdedup.DefaultBatchSize}, batches)
	if sizes := store.Sizes(); !slices.Equal(sizes, want) {
		t.Errorf("claims of %v keys, want %v", sizes, want)
	}
}
