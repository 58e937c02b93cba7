package deduptest

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/dedupkit/dedup"
)

// ErrStalled is what a [StallingStore]'s Extend returns while stalled.
var ErrStalled = errors.New("deduptest: lease extension held back (stalled worker)")

// StallingStore is a [dedup.Store] whose lease extensions can be held back,
// as those of a frozen or partitioned worker never reach the store: a lease
// taken through it lapses while its handler runs, for a test to let another
// worker take the event over. Every other call goes to the store it wraps.
type StallingStore struct {
	dedup.Store
	stalled atomic.Bool
}

// NewStallingStore returns a StallingStore over s, not stalled.
func NewStallingStore(s dedup.Store) *StallingStore { return &StallingStore{Store: s} }

// Stall makes Extend fail with ErrStalled until Resume.
func (s *StallingStore) Stall() { s.stalled.Store(true) }

// Resume lets Extend through to the store again.
func (s *StallingStore) Resume() { s.stalled.Store(false) }

// Extend returns ErrStalled while the store is stalled, and otherwise
// extends the lease in the wrapped store.
func (s *StallingStore) Extend(ctx context.Context, key dedup.Key, owner string, lease time.Duration) error {
	if s.stalled.Load() {
		return ErrStalled
	}
	return s.Store.Extend(ctx, key, owner, lease)
}
