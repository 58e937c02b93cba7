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
// so nothing runs and nothing may be acknowledged, or only the next few
// claims fail ([FaultyStore.RefuseNext]). Its other calls, and every call
// while it is up, go to the store it wraps. It hides the wrapped store's
// optional interfaces.
type FaultyStore struct {
	dedup.Store
	down    atomic.Bool
	next    atomic.Int64 // claim calls still to refuse while up
	refused atomic.Int64
}

// NewFaultyStore returns a FaultyStore over s, up.
func NewFaultyStore(s dedup.Store) *FaultyStore { return &FaultyStore{Store: s} }

// SetDown makes the store fail its claims (true) or pass them on (false).
func (s *FaultyStore) SetDown(down bool) { s.down.Store(down) }

// RefuseNext makes the next n claim calls (Claim or ClaimBatch) fail with
// [ErrStoreDown], and the ones after them pass on.
func (s *FaultyStore) RefuseNext(n int) { s.next.Store(int64(n)) }

// refuse reports whether this claim call fails, counting it when it does.
func (s *FaultyStore) refuse() bool {
	if !s.down.Load() && !s.takeNext() {
		return false
	}
	s.refused.Add(1)
	return true
}

// takeNext takes one of the claim calls RefuseNext asked to refuse.
func (s *FaultyStore) takeNext() bool {
	for {
		n := s.next.Load()
		if n <= 0 {
			return false
		}
		if s.next.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// Refused returns how many claim calls failed, while the store was down or
// refused by RefuseNext.
func (s *FaultyStore) Refused() int { return int(s.refused.Load()) }

// Claim fails while the store is down, or claims in the wrapped store.
func (s *FaultyStore) Claim(ctx context.Context, req dedup.ClaimRequest) (dedup.Claim, error) {
	if s.refuse() {
		return dedup.Claim{}, ErrStoreDown
	}
	return s.Store.Claim(ctx, req)
}

// ClaimBatch fails while the store is down, or claims in the wrapped store.
func (s *FaultyStore) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) ([]dedup.Claim, error) {
	if s.refuse() {
		return nil, ErrStoreDown
	}
	return s.Store.ClaimBatch(ctx, reqs)
}
