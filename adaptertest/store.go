package adaptertest

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/dedupkit/dedup"
)

// ErrStoreDown is what a [FaultyStore] fails with while it is down.
var ErrStoreDown = errors.New("adaptertest: store unreachable (injected)")

// FaultyStore is a dedup.Store whose claims fail with [ErrStoreDown] while
// it is down, as a database that is unreachable: nothing can be claimed,
// so nothing runs and nothing may be acknowledged. Its other calls, and
// every call while it is up, go to the store it wraps. It hides the
// wrapped store's optional interfaces.
type FaultyStore struct {
	dedup.Store
	down    atomic.Bool
	refused atomic.Int64
}

// NewFaultyStore returns a FaultyStore over s, up.
func NewFaultyStore(s dedup.Store) *FaultyStore { return &FaultyStore{Store: s} }

// SetDown makes the store fail its claims (true) or pass them on (false).
func (s *FaultyStore) SetDown(down bool) { s.down.Store(down) }

// Refused returns how many claim calls failed because the store was down.
func (s *FaultyStore) Refused() int { return int(s.refused.Load()) }

// Claim fails while the store is down, or claims in the wrapped store.
func (s *FaultyStore) Claim(ctx context.Context, req dedup.ClaimRequest) (dedup.Claim, error) {
	if s.down.Load() {
		s.refused.Add(1)
		return dedup.Claim{}, ErrStoreDown
	}
	return s.Store.Claim(ctx, req)
}

// ClaimBatch fails while the store is down, or claims in the wrapped store.
func (s *FaultyStore) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) ([]dedup.Claim, error) {
	if s.down.Load() {
		s.refused.Add(1)
		return nil, ErrStoreDown
	}
	return s.Store.ClaimBatch(ctx, reqs)
}
