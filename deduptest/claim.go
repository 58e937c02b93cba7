package deduptest

import (
	"sync"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/stretchr/testify/require"
)

func testAcquireNewKey(t *testing.T, s dedup.Store) {
	k := key(newScope(t), "evt-1")
	requireNotFound(t, s, k)

	c := acquire(t, s, request(k, "fp"))
	require.Equal(t, 1, c.Record.Attempts)
	require.Empty(t, c.Previous)
	require.True(t, c.Record.LeaseUntil.After(c.Record.CreatedAt), "lease ends after creation")
	require.True(t, c.Record.ExpiresAt.After(c.Record.LeaseUntil), "retention outlasts the lease")

	// The claim reports the record as stored; times may differ by the
	// backend's storage precision.
	rec := get(t, s, k)
	require.Equal(t, c.Record.Key, rec.Key)
	require.Equal(t, c.Record.Status, rec.Status)
	require.Equal(t, c.Record.Fingerprint, rec.Fingerprint)
	require.Equal(t, c.Record.Attempts, rec.Attempts)
	require.Equal(t, c.Record.Owner, rec.Owner)
	require.WithinDuration(t, c.Record.LeaseUntil, rec.LeaseUntil, time.Second)
	require.WithinDuration(t, c.Record.ExpiresAt, rec.ExpiresAt, time.Second)
}

func testConcurrentClaims(t *testing.T, s dedup.Store) {
	const n = 50
	k := key(newScope(t), "evt-1")
	ctx := ctxFor(t)
	start := make(chan struct{})
	claims := make([]dedup.Claim, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			claims[i], errs[i] = s.Claim(ctx, request(k, "fp"))
		})
	}
	close(start)
	wg.Wait()

	var winner dedup.Claim
	winners := 0
	for i, c := range claims {
		require.NoError(t, errs[i], "claimer %d", i)
		switch c.Status {
		case dedup.ClaimAcquired:
			winners++
			winner = c
		case dedup.ClaimInFlight, dedup.ClaimDuplicate:
		default:
			t.Fatalf("claimer %d: unexpected %v", i, c.Status)
		}
	}
	require.Equal(t, 1, winners, "exactly one claimer wins")
	require.Equal(t, 1, winner.Record.Attempts)
	for i, c := range claims {
		if c.Status == dedup.ClaimInFlight {
			require.Equal(t, winner.Record.Owner, c.Record.Owner, "claimer %d sees the winner's record", i)
		}
	}
	rec := get(t, s, k)
	require.Equal(t, winner.Record.Owner, rec.Owner)
	require.Equal(t, 1, rec.Attempts)

	complete(t, s, winner, nil, longTTL)
	require.Equal(t, dedup.ClaimDuplicate, claim(t, s, request(k, "fp")).Status)
}

func testExpiredLeaseTakenOver(t *testing.T, s dedup.Store) {
	req, first := acquireShortLease(t, s)
	k := req.Key

	alive := claim(t, s, req)
	require.Equal(t, dedup.ClaimInFlight, alive.Status, "lease still alive")
	require.Equal(t, first.Record.Owner, alive.Record.Owner)

	time.Sleep(leaseWait)

	// Only the same event may take over a lapsed lease.
	before := get(t, s, k)
	require.Equal(t, dedup.ClaimConflict, claim(t, s, request(k, "other")).Status)
	requireSameRecord(t, before, get(t, s, k))

	second := acquire(t, s, req)
	require.Equal(t, 2, second.Record.Attempts)
	require.Equal(t, dedup.StatusProcessing, second.Previous)
	require.NotEqual(t, first.Record.Owner, second.Record.Owner, "takeover gets a new owner token")

	rec := get(t, s, k)
	require.Equal(t, second.Record.Owner, rec.Owner)
	require.Equal(t, 2, rec.Attempts)
	require.Equal(t, dedup.StatusProcessing, rec.Status)
}

func testExpiredLeaseMayComplete(t *testing.T, s dedup.Store) {
	req, c := acquireShortLease(t, s)
	k := req.Key

	time.Sleep(leaseWait)

	// Fencing is on the owner token: nobody took over, so the owner still may.
	complete(t, s, c, nil, longTTL)
	require.Equal(t, dedup.StatusSucceeded, get(t, s, k).Status)
	require.Equal(t, dedup.ClaimDuplicate, claim(t, s, req).Status)
}

func testFailedRetryableTakenOver(t *testing.T, s dedup.Store) {
	k := key(newScope(t), "evt-1")
	req := request(k, "fp")
	first := acquire(t, s, req)
	fail(t, s, first, dedup.Failure{Error: "boom 1", TTL: longTTL})

	failed := get(t, s, k)
	require.Equal(t, dedup.StatusFailedRetryable, failed.Status)
	require.Equal(t, "boom 1", failed.LastError)
	require.Equal(t, 1, failed.Attempts)
	require.False(t, failed.FirstFailure.IsZero(), "FirstFailure set")
	require.False(t, failed.LastFailure.IsZero(), "LastFailure set")

	// The lease is still running, yet a retryable failure is taken over at once.
	second := acquire(t, s, req)
	require.Equal(t, 2, second.Record.Attempts)
	require.Equal(t, dedup.StatusFailedRetryable, second.Previous)
	require.NotEqual(t, first.Record.Owner, second.Record.Owner)

	fail(t, s, second, dedup.Failure{Error: "boom 2", TTL: longTTL})
	again := get(t, s, k)
	require.Equal(t, "boom 2", again.LastError)
	require.True(t, again.FirstFailure.Equal(failed.FirstFailure), "FirstFailure kept: %v, was %v", again.FirstFailure, failed.FirstFailure)
	require.False(t, again.LastFailure.Before(failed.LastFailure), "LastFailure moves forward")

	third := acquire(t, s, req)
	require.Equal(t, 3, third.Record.Attempts)
	require.Equal(t, 3, get(t, s, k).Attempts)
}

func testStaleOwnerFenced(t *testing.T, s dedup.Store) {
	req, stale := acquireShortLease(t, s)
	k := req.Key
	time.Sleep(leaseWait)
	current := acquire(t, s, req)

	requireStaleRefused := func() {
		t.Helper()
		before := get(t, s, k)
		ctx := ctxFor(t)
		require.ErrorIs(t, s.Complete(ctx, k, stale.Record.Owner, []byte("stale"), longTTL), dedup.ErrLeaseLost, "complete")
		require.ErrorIs(t, s.Fail(ctx, k, stale.Record.Owner, dedup.Failure{Error: "stale", TTL: longTTL}), dedup.ErrLeaseLost, "fail")
		require.ErrorIs(t, s.Fail(ctx, k, stale.Record.Owner, dedup.Failure{Final: true, Error: "stale", TTL: longTTL}), dedup.ErrLeaseLost, "fail final")
		require.ErrorIs(t, s.Extend(ctx, k, stale.Record.Owner, longLease), dedup.ErrLeaseLost, "extend")
		requireSameRecord(t, before, get(t, s, k))
	}
	requireStaleRefused()
	require.Equal(t, current.Record.Owner, get(t, s, k).Owner)

	complete(t, s, current, []byte("current"), longTTL)
	requireStaleRefused()
	require.Equal(t, []byte("current"), get(t, s, k).Result)
}

func testSettledRecordRejectsOwner(t *testing.T, s dedup.Store) {
	scope := newScope(t)
	requireRefused := func(t *testing.T, k dedup.Key, owner string) {
		t.Helper()
		ctx := ctxFor(t)
		require.ErrorIs(t, s.Complete(ctx, k, owner, []byte("late"), longTTL), dedup.ErrLeaseLost, "complete")
		require.ErrorIs(t, s.Fail(ctx, k, owner, dedup.Failure{Error: "late", TTL: longTTL}), dedup.ErrLeaseLost, "fail")
		require.ErrorIs(t, s.Extend(ctx, k, owner, longLease), dedup.ErrLeaseLost, "extend")
	}

	t.Run("never claimed", func(t *testing.T) {
		k := key(scope, "absent")
		requireRefused(t, k, deduptype.NewOwnerToken())
		requireNotFound(t, s, k)
	})
	t.Run("wrong owner", func(t *testing.T) {
		k := key(scope, "processing")
		acquire(t, s, request(k, "fp"))
		before := get(t, s, k)
		requireRefused(t, k, deduptype.NewOwnerToken())
		requireSameRecord(t, before, get(t, s, k))
	})
	for _, status := range []dedup.Status{dedup.StatusSucceeded, dedup.StatusFailedRetryable, dedup.StatusFailedFinal} {
		t.Run(string(status), func(t *testing.T) {
			k := key(scope, string(status))
			c := acquire(t, s, request(k, "fp"))
			settle(t, s, c, status, longTTL)
			before := get(t, s, k)
			requireRefused(t, k, c.Record.Owner)
			requireSameRecord(t, before, get(t, s, k))
		})
	}
}

func testFingerprintConflict(t *testing.T, s dedup.Store) {
	scope := newScope(t)
	for _, status := range statuses {
		t.Run(string(status), func(t *testing.T) {
			k := key(scope, string(status))
			create(t, s, k, status, longTTL)
			before := get(t, s, k)
			require.Equal(t, status, before.Status)

			c := claim(t, s, request(k, "other"))
			require.Equal(t, dedup.ClaimConflict, c.Status)
			require.Equal(t, "fp", c.Record.Fingerprint, "the conflict reports the stored record")
			require.Equal(t, status, c.Record.Status)
			requireSameRecord(t, before, get(t, s, k))
		})
	}
}

func testFailedFinalStaysFinal(t *testing.T, s dedup.Store) {
	req, c := acquireShortLease(t, s)
	k := req.Key
	fail(t, s, c, dedup.Failure{Final: true, Error: "poison", TTL: longTTL})

	for _, when := range []string{"at once", "after the lease"} {
		if when == "after the lease" {
			time.Sleep(leaseWait)
		}
		got := claim(t, s, req)
		require.Equal(t, dedup.ClaimFinal, got.Status, when)
		require.Equal(t, dedup.StatusFailedFinal, got.Record.Status, when)
		rec := get(t, s, k)
		require.Equal(t, dedup.StatusFailedFinal, rec.Status, when)
		require.Equal(t, 1, rec.Attempts, when)
		require.Equal(t, "poison", rec.LastError, when)
	}
}

func testExtendKeepsLeaseAlive(t *testing.T, s dedup.Store) {
	req, c := acquireShortLease(t, s)
	k := req.Key
	before := get(t, s, k)

	require.NoError(t, s.Extend(ctxFor(t), k, c.Record.Owner, longLease))
	extended := get(t, s, k)
	require.True(t, extended.LeaseUntil.After(before.LeaseUntil), "lease pushed from %v to %v", before.LeaseUntil, extended.LeaseUntil)
	require.Equal(t, c.Record.Owner, extended.Owner)
	require.Equal(t, 1, extended.Attempts)

	time.Sleep(leaseWait)
	other := claim(t, s, req)
	require.Equal(t, dedup.ClaimInFlight, other.Status, "extended lease outlives its original length")
	require.Equal(t, c.Record.Owner, other.Record.Owner)
	complete(t, s, c, nil, longTTL)
}

func testCompleteStoresResult(t *testing.T, s dedup.Store) {
	k := key(newScope(t), "evt-1")
	c := acquire(t, s, request(k, "fp"))
	result := []byte("result-1")
	complete(t, s, c, result, longTTL)
	result[0] = 'X' // the store keeps its own copy

	rec := get(t, s, k)
	require.Equal(t, dedup.StatusSucceeded, rec.Status)
	require.Equal(t, []byte("result-1"), rec.Result)
	require.Equal(t, 1, rec.Attempts)
	rec.Result[0] = 'Y' // and hands out copies

	dup := claim(t, s, request(k, "fp"))
	require.Equal(t, dedup.ClaimDuplicate, dup.Status)
	require.Equal(t, dedup.StatusSucceeded, dup.Record.Status)
	require.Equal(t, []byte("result-1"), dup.Record.Result)
	dup.Record.Result[0] = 'Z'

	require.Equal(t, []byte("result-1"), get(t, s, k).Result)
}

func testScopesAreIndependent(t *testing.T, s dedup.Store) {
	a := key(newScope(t), "evt-1")
	b := key(newScope(t), "evt-1")
	ca := acquire(t, s, request(a, "fp-a"))
	cb := acquire(t, s, request(b, "fp-b")) // another fingerprint is no conflict across scopes
	require.Equal(t, 1, ca.Record.Attempts)
	require.Equal(t, 1, cb.Record.Attempts)

	complete(t, s, ca, nil, longTTL)
	recB := get(t, s, b)
	require.Equal(t, dedup.StatusProcessing, recB.Status)
	require.Equal(t, cb.Record.Owner, recB.Owner)
	require.Equal(t, dedup.ClaimDuplicate, claim(t, s, request(a, "fp-a")).Status)
	require.Equal(t, dedup.ClaimInFlight, claim(t, s, request(b, "fp-b")).Status)
}

// testReleaseUncountsAttempt: a claim given back before its handler started
// is claimable at once by anyone and the attempt does not count; a stale
// owner cannot release the new owner's claim.
func testReleaseUncountsAttempt(t *testing.T, s dedup.Store) {
	scope := newScope(t)
	req := request(key(scope, "released"), "fp")
	first := acquire(t, s, req)
	require.NoError(t, s.Release(ctxFor(t), first.Record.Key, first.Record.Owner))
	again := acquire(t, s, req)
	require.Equal(t, 1, again.Record.Attempts, "a released claim is not an attempt")
	require.NotEqual(t, first.Record.Owner, again.Record.Owner)

	before := get(t, s, req.Key)
	err := s.Release(ctxFor(t), req.Key, first.Record.Owner)
	require.ErrorIs(t, err, dedup.ErrLeaseLost)
	requireSameRecord(t, before, get(t, s, req.Key))

	// A takeover after a failure keeps the failed attempt counted.
	fail(t, s, again, dedup.Failure{Error: "boom", TTL: longTTL})
	third := acquire(t, s, req)
	require.Equal(t, 2, third.Record.Attempts)
	require.NoError(t, s.Release(ctxFor(t), req.Key, third.Record.Owner))
	require.Equal(t, 2, acquire(t, s, req).Record.Attempts)
}
