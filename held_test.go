package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
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
	h, err := dedup.Hold(store, c, 300*time.Millisecond, nil)
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

	_, err = dedup.Hold(store, dedup.Claim{Status: dedup.ClaimDuplicate}, time.Minute, nil)
	require.ErrorIs(t, err, dedup.ErrConfig)
}

// A front end other than a Wrapper claims a key, keeps the claim while its
// operation runs, and stores the operation's result.
func ExampleHold() {
	ctx := context.Background()
	store := dedup.NewMemoryStore()
	key := dedup.Key{Scope: "payments/api", EventID: "req-42"}
	c, err := store.Claim(ctx, dedup.ClaimRequest{Key: key, Fingerprint: "body-hash", Lease: 30 * time.Second, TTL: 24 * time.Hour})
	if err != nil || c.Status != dedup.ClaimAcquired {
		fmt.Println("not ours:", c.Status, err)
		return
	}
	h, err := dedup.Hold(store, c, 30*time.Second, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	var result []byte
	if err := h.Run(ctx, func(ctx context.Context) error {
		result = []byte("charged")
		return nil
	}); err != nil {
		_ = h.Fail(ctx, dedup.Failure{Error: err.Error(), TTL: 24 * time.Hour})
		return
	}
	if err := h.Complete(ctx, result, 24*time.Hour); err != nil {
		fmt.Println(err)
		return
	}
	rec, _ := store.Get(ctx, key)
	fmt.Println(rec.Status, string(rec.Result))
	// Output: SUCCEEDED charged
}
