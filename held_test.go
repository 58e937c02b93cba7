package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/inmodule"
)

// heldStore refuses every lease extension, as when another worker took the
// key over, and loses the answer of the first completion it applies.
type heldStore struct {
	dedup.Store
	completes int
}

func (s *heldStore) Extend(_ context.Context, key dedup.Key, _ string, _ time.Duration) error {
	return fmt.Errorf("held test: extend %s: %w", key, dedup.ErrLeaseLost)
}

func (s *heldStore) Complete(ctx context.Context, key dedup.Key, owner string, result []byte, ttl time.Duration) error {
	err := s.Store.Complete(ctx, key, owner, result, ttl)
	if s.completes++; s.completes == 1 && err == nil {
		return errors.New("held test: connection reset after the write")
	}
	return err
}

// hold is the root package's hold, as idemhttp reaches it.
var hold = inmodule.Hold.(func(dedup.Store, dedup.Claim, time.Duration, *slog.Logger) (inmodule.Held[dedup.Failure], error))

func acquire(t *testing.T, store dedup.Store) dedup.Claim {
	t.Helper()
	c, err := store.Claim(context.Background(), dedup.ClaimRequest{Key: dedup.Key{Scope: uniqueScope(t), EventID: "op"},
		Fingerprint: "f", Lease: time.Minute, TTL: time.Hour})
	require.NoError(t, err)
	require.Equal(t, dedup.ClaimAcquired, c.Status)
	return c
}

// A held claim whose lease is lost cancels its work with ErrLeaseLost as the
// cause; a completion whose first answer was lost, then refused, counts as
// written because it landed; a panic comes back as a *PanicError.
func TestHeld(t *testing.T) {
	store := &heldStore{Store: dedup.NewMemoryStore()}
	c := acquire(t, store)
	h, err := hold(store, c, 300*time.Millisecond, nil)
	require.NoError(t, err)
	err = h.Run(context.Background(), func(ctx context.Context) error {
		<-ctx.Done() // the first extension, at a third of the lease, is refused
		return context.Cause(ctx)
	})
	require.ErrorIs(t, err, dedup.ErrLeaseLost)

	require.NoError(t, h.Complete(context.Background(), []byte("answer"), time.Hour))
	require.Equal(t, 2, store.completes, "tried again after the lost answer")
	rec, err := store.Get(context.Background(), c.Record.Key)
	require.NoError(t, err)
	require.Equal(t, dedup.StatusSucceeded, rec.Status)
	require.Equal(t, []byte("answer"), rec.Result)

	err = h.Run(context.Background(), func(context.Context) error { panic("boom") })
	var perr *dedup.PanicError
	require.ErrorAs(t, err, &perr)
	require.Equal(t, "boom", perr.Value)

	_, err = hold(store, dedup.Claim{Status: dedup.ClaimDuplicate}, time.Minute, nil)
	require.ErrorIs(t, err, dedup.ErrConfig)
}
