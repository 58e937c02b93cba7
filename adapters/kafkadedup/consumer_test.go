package kafkadedup_test

import (
	"context"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Re-sent events (same event-id, same payload) give one effect each, and
// the group's committed offsets reach the end of every partition.
func TestDuplicatesGiveOneEffect(t *testing.T) {
	c := newCluster(t, 4)
	evs := events("dup", 600, 16)
	all := slices.Clone(evs)
	for i := 0; i < len(evs); i += 5 { // every fifth event is sent again
		all = append(all, evs[i])
	}
	rand.Shuffle(len(all)-len(evs), func(i, j int) {
		all[len(evs)+i], all[len(evs)+j] = all[len(evs)+j], all[len(evs)+i]
	})
	recs := c.produce(all...)

	fx := newEffects()
	w := wrap(t, dedup.NewMemoryStore(), c.sink(), kafkadedup.Scope(c.group, "apply"),
		func(_ context.Context, r *kgo.Record) error { fx.apply(r); return nil },
		dedup.WithObserver(fx.observe))
	run := start(t, newConsumer(t, w, kafkadedup.WithClientOpts(c.clientOpts(c.group)...)))

	want := endOffsets(recs)
	eventually(t, 15*time.Second, func() bool { return maps.Equal(c.committed(c.group), want) },
		"committed offsets never reached %v", want)
	run.stop(t)

	count, outcomes := fx.snapshot()
	if len(count) != len(evs) {
		t.Errorf("%d distinct events had an effect, want %d", len(count), len(evs))
	}
	for id, n := range count {
		if n != 1 {
			t.Errorf("event %s had %d effects, want 1", id, n)
		}
	}
	if outcomes[dedup.Processed] != len(evs) || outcomes[dedup.Duplicate] != len(all)-len(evs) {
		t.Errorf("outcomes %v, want %d processed and %d duplicates", outcomes, len(evs), len(all)-len(evs))
	}
}
