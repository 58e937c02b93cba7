package adaptertest

import (
	"context"
	"slices"
	"sync"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
)

// ClaimSizes is a dedup.Store that records how many keys each claim call
// asks of the store it wraps (1 for a Claim), so that a test can see the
// batches an adapter forms. It passes batch completions on; the wrapped
// store must implement deduptype.BatchCompleter (the stores of this module
// do).
type ClaimSizes struct {
	dedup.Store
	mu    sync.Mutex
	sizes []int
}

// NewClaimSizes returns a ClaimSizes over s.
func NewClaimSizes(s dedup.Store) *ClaimSizes { return &ClaimSizes{Store: s} }

func (s *ClaimSizes) add(n int) {
	s.mu.Lock()
	s.sizes = append(s.sizes, n)
	s.mu.Unlock()
}

// Claim records a claim of one key and claims it in the wrapped store.
func (s *ClaimSizes) Claim(ctx context.Context, req dedup.ClaimRequest) (dedup.Claim, error) {
	s.add(1)
	return s.Store.Claim(ctx, req)
}

// ClaimBatch records a claim of len(reqs) keys and claims them in the
// wrapped store.
func (s *ClaimSizes) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) ([]dedup.Claim, error) {
	s.add(len(reqs))
	return s.Store.ClaimBatch(ctx, reqs)
}

// CompleteBatch completes cs in the wrapped store.
func (s *ClaimSizes) CompleteBatch(ctx context.Context, cs []deduptype.Completion) ([]error, error) {
	return s.Store.(deduptype.BatchCompleter).CompleteBatch(ctx, cs)
}

// Sizes returns the number of keys of each claim call so far, sorted: the
// calls of batches handled at once come in no particular order.
func (s *ClaimSizes) Sizes() []int {
	s.mu.Lock()
	sizes := slices.Clone(s.sizes)
	s.mu.Unlock()
	slices.Sort(sizes)
	return sizes
}
