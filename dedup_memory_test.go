package dedup_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/stretchr/testify/require"
)

// Unlike the conformance suite, these use leases and retention far shorter
// than a backend with a coarse clock could honour.

func TestMemoryStoreExpiredRecordRejectsOwner(t *testing.T) {
	ctx := context.Background()
	s := dedup.NewMemoryStore()
	k := dedup.Key{Scope: "s", EventID: "e"}
	c, err := s.Claim(ctx, dedup.ClaimRequest{Key: k, Fingerprint: "fp", Lease: time.Minute, TTL: 10 * time.Millisecond})
	require.NoError(t, err)
	require.Equal(t, dedup.ClaimAcquired, c.Status)

	time.Sleep(20 * time.Millisecond)

	// An expired record is absent, even to its owner.
	require.ErrorIs(t, s.Complete(ctx, k, c.Record.Owner, nil, time.Hour), dedup.ErrLeaseLost)
	require.ErrorIs(t, s.Fail(ctx, k, c.Record.Owner, dedup.Failure{TTL: time.Hour}), dedup.ErrLeaseLost)
	require.ErrorIs(t, s.Extend(ctx, k, c.Record.Owner, time.Hour), dedup.ErrLeaseLost)
	n, err := s.Purge(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = s.Purge(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestMemoryStoreErrorsNameOperationAndKey(t *testing.T) {
	s := dedup.NewMemoryStore()
	k := dedup.Key{Scope: "billing", EventID: "evt-1"}
	err := s.Complete(context.Background(), k, "nobody", nil, time.Hour)
	require.EqualError(t, err, "dedup: memory complete billing/evt-1: lease lost")
	_, err = s.Get(context.Background(), k)
	require.EqualError(t, err, "dedup: memory get billing/evt-1: record not found")
}

// BenchmarkMemoryStoreClaimComplete measures the store's share of the
// wrapper's per-event cost: a claim of a new key, then its completion.
func BenchmarkMemoryStoreClaimComplete(b *testing.B) {
	// Every key is new within a window, and the store starts afresh each
	// window so that memory stays bounded however large b.N grows. The cost
	// per event grows with the map (growth, cache misses, GC): about 1.6x at
	// a million keys.
	const window = 1 << 16
	ids := make([]string, window)
	for i := range ids {
		ids[i] = "evt-" + strconv.Itoa(i)
	}
	ctx := context.Background()
	s := dedup.NewMemoryStore()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%window == 0 && i > 0 {
			s = dedup.NewMemoryStore()
		}
		req := dedup.ClaimRequest{
			Key:         dedup.Key{Scope: "orders/handler", EventID: ids[i%window]},
			Fingerprint: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
			Lease:       time.Minute,
			TTL:         7 * 24 * time.Hour,
		}
		c, err := s.Claim(ctx, req)
		if err != nil || c.Status != dedup.ClaimAcquired {
			b.Fatalf("claim %d: %v %v", i, c.Status, err)
		}
		if err := s.Complete(ctx, req.Key, c.Record.Owner, nil, req.TTL); err != nil {
			b.Fatal(err)
		}
	}
}

// A TTL or lease of centuries, a way to say "keep it", must not wrap around
// into the past: the record stays live and held.
func TestMemoryStoreKeepsRecordsOfCenturiesLive(t *testing.T) {
	ctx := context.Background()
	s := dedup.NewMemoryStore()
	k := dedup.Key{Scope: "s", EventID: "forever"}
	const forever = time.Duration(1<<63 - 1)
	c, err := s.Claim(ctx, dedup.ClaimRequest{Key: k, Fingerprint: "fp", Lease: forever, TTL: forever})
	require.NoError(t, err)
	require.Equal(t, dedup.ClaimAcquired, c.Status)
	require.True(t, c.Record.ExpiresAt.After(time.Now().AddDate(200, 0, 0)), "expires at %v", c.Record.ExpiresAt)
	require.True(t, c.Record.LeaseUntil.After(time.Now().AddDate(200, 0, 0)), "lease until %v", c.Record.LeaseUntil)

	again, err := s.Claim(ctx, dedup.ClaimRequest{Key: k, Fingerprint: "fp", Lease: time.Minute, TTL: time.Minute})
	require.NoError(t, err)
	require.Equal(t, dedup.ClaimInFlight, again.Status)

	require.NoError(t, s.Complete(ctx, k, c.Record.Owner, []byte("r"), forever))
	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	require.Equal(t, dedup.StatusSucceeded, rec.Status)
	require.Equal(t, []byte("r"), rec.Result)
	n, err := s.Purge(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
}
