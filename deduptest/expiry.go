package deduptest

import (
	"context"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/stretchr/testify/require"
)

func testExpiredRecordCountsAsAbsent(t *testing.T, s dedup.Store) {
	scope := newScope(t)
	batched := func(status dedup.Status) dedup.Key { return key(scope, "batch-"+string(status)) }
	// A processing record keeps its long lease: expiry beats a live lease.
	for _, status := range statuses {
		create(t, s, key(scope, string(status)), status, shortTTL)
		create(t, s, batched(status), status, shortTTL)
	}

	time.Sleep(ttlWait)

	// Claimed together, the expired records start afresh too, and each
	// claim's record is the one stored.
	var reqs []dedup.ClaimRequest
	for _, status := range statuses {
		reqs = append(reqs, request(batched(status), "other"))
	}
	for i, c := range claimBatch(t, s, reqs) {
		require.Equal(t, dedup.ClaimAcquired, c.Status, statuses[i])
		require.Equal(t, 1, c.Record.Attempts, statuses[i])
		require.Empty(t, c.Previous, statuses[i])
		requireSameRecord(t, get(t, s, reqs[i].Key), c.Record)
	}

	for _, status := range statuses {
		k := key(scope, string(status))
		requireNotFound(t, s, k)
		// Absent whatever it held: even another fingerprint starts afresh.
		c := acquire(t, s, request(k, "other"))
		require.Equal(t, 1, c.Record.Attempts, status)
		require.Empty(t, c.Previous, status)
		rec := get(t, s, k)
		require.Equal(t, 1, rec.Attempts, status)
		require.Equal(t, "other", rec.Fingerprint, status)
		require.Equal(t, c.Record.Owner, rec.Owner, status)
		require.Empty(t, rec.Result, status)
		require.Empty(t, rec.LastError, status)
	}
}

func testPurgeRemovesExpired(t *testing.T, s dedup.Store, cfg config) {
	scope := newScope(t)
	expired := func(status dedup.Status) dedup.Key { return key(scope, "expired-"+string(status)) }
	live := func(status dedup.Status) dedup.Key { return key(scope, "live-"+string(status)) }
	for _, status := range statuses {
		create(t, s, expired(status), status, shortTTL)
		create(t, s, live(status), status, longTTL)
	}

	time.Sleep(ttlWait)

	n, err := s.Purge(ctxFor(t))
	require.NoError(t, err)
	if !cfg.expiryDeletes {
		require.GreaterOrEqual(t, n, len(statuses), "purged count")
	}
	for _, status := range statuses {
		requireNotFound(t, s, expired(status))
		require.Equal(t, status, get(t, s, live(status)).Status, "live record kept")
	}
	c := acquire(t, s, request(expired(dedup.StatusSucceeded), "fp"))
	require.Equal(t, 1, c.Record.Attempts, "a purged key starts afresh")
}

func testCancelledContext(t *testing.T, s dedup.Store) {
	scope := newScope(t)
	held := acquire(t, s, request(key(scope, "held"), "fp"))
	k, owner := held.Record.Key, held.Record.Owner
	before := get(t, s, k)
	fresh := key(scope, "fresh")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()

	calls := []struct {
		name string
		call func() error
	}{
		{"Claim", func() error { _, err := s.Claim(ctx, request(fresh, "fp")); return err }},
		{"ClaimBatch", func() error { _, err := s.ClaimBatch(ctx, []dedup.ClaimRequest{request(fresh, "fp")}); return err }},
		{"Complete", func() error { return s.Complete(ctx, k, owner, []byte("r"), longTTL) }},
		{"Fail", func() error { return s.Fail(ctx, k, owner, dedup.Failure{Error: "x", TTL: longTTL}) }},
		{"Extend", func() error { return s.Extend(ctx, k, owner, 2*longLease) }},
		{"Release", func() error { return s.Release(ctx, k, owner) }},
		{"Get", func() error { _, err := s.Get(ctx, k); return err }},
		{"Purge", func() error { _, err := s.Purge(ctx); return err }},
	}
	for _, c := range calls {
		done := make(chan error, 1)
		go func() { done <- c.call() }()
		select {
		case err := <-done:
			require.ErrorIs(t, err, context.Canceled, c.name)
		case <-time.After(callTimeout):
			t.Fatalf("%s with a cancelled context did not return within %v", c.name, callTimeout)
		}
	}
	requireNotFound(t, s, fresh)
	requireSameRecord(t, before, get(t, s, k))
}
