package natsdedup_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/natsdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/deduptype"
)

// claimSizes records how many keys each claim call of a real store asks
// for (1 for a Claim).
type claimSizes struct {
	dedup.Store
	mu    sync.Mutex
	sizes []int
}

func (s *claimSizes) add(n int) {
	s.mu.Lock()
	s.sizes = append(s.sizes, n)
	s.mu.Unlock()
}

func (s *claimSizes) Claim(ctx context.Context, req dedup.ClaimRequest) (dedup.Claim, error) {
	s.add(1)
	return s.Store.Claim(ctx, req)
}

func (s *claimSizes) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) ([]dedup.Claim, error) {
	s.add(len(reqs))
	return s.Store.ClaimBatch(ctx, reqs)
}

func (s *claimSizes) CompleteBatch(ctx context.Context, cs []deduptype.Completion) ([]error, error) {
	return s.Store.(deduptype.BatchCompleter).CompleteBatch(ctx, cs)
}

func (s *claimSizes) all() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.sizes)
}

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
	store := &claimSizes{Store: dedup.NewMemoryStore()}
	rec := adaptertest.NewEffects()
	start(t, cons, wrap(t, store, rec, func(_ context.Context, m jetstream.Msg) error {
		rec.Apply(eventID(m))
		return nil
	}))
	adaptertest.WaitFor(t, deadline, "every event applied", func() bool { return rec.Applied() == n })
	rec.AssertOnce(t, ids)
	assertAllAcked(t, cons)
	want := slices.Repeat([]int{natsdedup.DefaultBatchSize}, batches)
	if sizes := store.all(); !slices.Equal(sizes, want) {
		t.Errorf("claims of %v keys, want %v", sizes, want)
	}
}
