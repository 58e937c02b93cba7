// Package deduptest is the conformance suite every [dedup.Store] must pass.
//
// Each case writes under its own random scope, so the suite can run against a
// shared backend (one Postgres table, one DynamoDB table) repeatedly and in
// parallel with other tests. The only exception is the Purge case, which
// assumes nobody else purges the same backend while it runs.
package deduptest

import (
	"context"
	"crypto/rand"
	"path"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/stretchr/testify/require"
)

// Timings chosen for backends whose clocks are coarse: DynamoDB's TTL
// attribute holds whole epoch seconds.
const (
	shortLease = 300 * time.Millisecond
	leaseWait  = shortLease + 200*time.Millisecond
	shortTTL   = time.Second
	ttlWait    = 2100 * time.Millisecond
	longLease  = time.Minute
	longTTL    = time.Hour
	// callTimeout bounds every store call the suite makes, so a hanging
	// backend fails the case instead of the whole test binary.
	callTimeout = 10 * time.Second
)

// Opt changes what [Run] expects of a store.
type Opt interface{ apply(*config) }

type optFunc func(*config)

func (f optFunc) apply(c *config) { f(c) }

type config struct {
	expiryDeletes bool
}

// WithExpiryDeletes tells [Run] that the backend deletes expired records by
// itself (Redis key expiry), so that Purge finds nothing to do and may
// report 0. The Purge case then checks that expired records are gone and
// live ones kept, without counting what Purge removed.
func WithExpiryDeletes() Opt { return optFunc(func(c *config) { c.expiryDeletes = true }) }

// Run checks s against the [dedup.Store] contract, one subtest per case. The
// cases run in parallel; Run returns only after all of them have finished, so
// the caller may close s's resources right after it.
func Run(t *testing.T, s dedup.Store, opts ...Opt) {
	t.Helper()
	var cfg config
	for _, o := range opts {
		o.apply(&cfg)
	}
	cases := []struct {
		name string
		run  func(t *testing.T, s dedup.Store)
	}{
		// The slowest cases first, so the others fill the remaining slots.
		{"ExpiredRecordCountsAsAbsent", testExpiredRecordCountsAsAbsent},
		{"PurgeRemovesExpired", func(t *testing.T, s dedup.Store) { testPurgeRemovesExpired(t, s, cfg) }},
		{"AcquireNewKey", testAcquireNewKey},
		{"Concurrent50ClaimsOneWinner", testConcurrentClaims},
		{"ExpiredLeaseTakenOver", testExpiredLeaseTakenOver},
		{"ExpiredLeaseNotTakenOverMayComplete", testExpiredLeaseMayComplete},
		{"FailedRetryableTakenOver", testFailedRetryableTakenOver},
		{"StaleOwnerFenced", testStaleOwnerFenced},
		{"SettledRecordRejectsOwner", testSettledRecordRejectsOwner},
		{"FingerprintConflict", testFingerprintConflict},
		{"FailedFinalStaysFinal", testFailedFinalStaysFinal},
		{"ExtendKeepsLeaseAlive", testExtendKeepsLeaseAlive},
		{"ReleaseUncountsAttempt", testReleaseUncountsAttempt},
		{"CompleteStoresResult", testCompleteStoresResult},
		{"CompleteBatch", testCompleteBatch},
		{"BatchRepeatedKeyRejected", testBatchRepeatedKeyRejected},
		{"BatchMatchesSingleClaims", testBatchMatchesSingleClaims},
		{"ConcurrentBatchesOneWinnerPerKey", testConcurrentBatches},
		{"InvalidKeysRejected", testInvalidKeysRejected},
		{"MaxLengthKeyAccepted", testMaxLengthKeyAccepted},
		{"ScopesAreIndependent", testScopesAreIndependent},
		{"CancelledContext", testCancelledContext},
	}
	// The group blocks until its parallel subtests are done.
	t.Run("deduptest", func(t *testing.T) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				c.run(t, s)
			})
		}
	})
}

// newScope returns a scope no other case or earlier run has used.
func newScope(t *testing.T) string {
	return "deduptest." + path.Base(t.Name()) + "." + rand.Text()
}

func key(scope, id string) dedup.Key { return dedup.Key{Scope: scope, EventID: id} }

// request is a claim with a long lease and retention unless changed.
func request(k dedup.Key, fingerprint string) dedup.ClaimRequest {
	return dedup.ClaimRequest{Key: k, Fingerprint: fingerprint, Lease: longLease, TTL: longTTL}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
	t.Cleanup(cancel)
	return ctx
}

func claim(t *testing.T, s dedup.Store, req dedup.ClaimRequest) dedup.Claim {
	t.Helper()
	c, err := s.Claim(ctxFor(t), req)
	require.NoError(t, err, "claim %s", req.Key)
	return c
}

// acquire claims req and requires a fresh or taken-over lease.
func acquire(t *testing.T, s dedup.Store, req dedup.ClaimRequest) dedup.Claim {
	t.Helper()
	c := claim(t, s, req)
	require.Equal(t, dedup.ClaimAcquired, c.Status, "claim %s", req.Key)
	require.Equal(t, req.Key, c.Record.Key)
	require.Equal(t, dedup.StatusProcessing, c.Record.Status)
	require.Equal(t, req.Fingerprint, c.Record.Fingerprint)
	require.NotEmpty(t, c.Record.Owner)
	return c
}

// acquireShortLease acquires a key of a new scope with a short lease; req
// claims it again.
func acquireShortLease(t *testing.T, s dedup.Store) (req dedup.ClaimRequest, c dedup.Claim) {
	t.Helper()
	req = request(key(newScope(t), "evt-1"), "fp")
	req.Lease = shortLease
	return req, acquire(t, s, req)
}

func get(t *testing.T, s dedup.Store, k dedup.Key) dedup.Record {
	t.Helper()
	rec, err := s.Get(ctxFor(t), k)
	require.NoError(t, err, "get %s", k)
	return rec
}

func requireNotFound(t *testing.T, s dedup.Store, k dedup.Key) {
	t.Helper()
	_, err := s.Get(ctxFor(t), k)
	require.ErrorIs(t, err, dedup.ErrNotFound, "get %s", k)
}

func complete(t *testing.T, s dedup.Store, c dedup.Claim, result []byte, ttl time.Duration) {
	t.Helper()
	require.NoError(t, s.Complete(ctxFor(t), c.Record.Key, c.Record.Owner, result, ttl), "complete %s", c.Record.Key)
}

func fail(t *testing.T, s dedup.Store, c dedup.Claim, f dedup.Failure) {
	t.Helper()
	require.NoError(t, s.Fail(ctxFor(t), c.Record.Key, c.Record.Owner, f), "fail %s", c.Record.Key)
}

// requireSameRecord compares records field by field, times by instant, so a
// backend's time representation (location, monotonic reading) does not matter.
func requireSameRecord(t *testing.T, want, got dedup.Record) {
	t.Helper()
	require.Equal(t, want.Key, got.Key, "Key")
	require.Equal(t, want.Status, got.Status, "Status")
	require.Equal(t, want.Fingerprint, got.Fingerprint, "Fingerprint")
	require.Equal(t, want.Attempts, got.Attempts, "Attempts")
	require.Equal(t, want.Owner, got.Owner, "Owner")
	require.Equal(t, want.LastError, got.LastError, "LastError")
	require.Equal(t, want.Result, got.Result, "Result")
	for _, f := range []struct {
		name      string
		want, got time.Time
	}{
		{"LeaseUntil", want.LeaseUntil, got.LeaseUntil},
		{"CreatedAt", want.CreatedAt, got.CreatedAt},
		{"UpdatedAt", want.UpdatedAt, got.UpdatedAt},
		{"ExpiresAt", want.ExpiresAt, got.ExpiresAt},
		{"FirstFailure", want.FirstFailure, got.FirstFailure},
		{"LastFailure", want.LastFailure, got.LastFailure},
	} {
		require.True(t, f.want.Equal(f.got), "%s: want %v, got %v", f.name, f.want, f.got)
	}
}

// statuses lists every status, for cases that cover each.
var statuses = []dedup.Status{
	dedup.StatusProcessing, dedup.StatusSucceeded, dedup.StatusFailedRetryable, dedup.StatusFailedFinal,
}

// settle moves the acquired claim c to status, retained for ttl; for
// StatusProcessing it leaves the record as it is.
func settle(t *testing.T, s dedup.Store, c dedup.Claim, status dedup.Status, ttl time.Duration) {
	t.Helper()
	switch status {
	case dedup.StatusSucceeded:
		complete(t, s, c, []byte("result"), ttl)
	case dedup.StatusFailedRetryable:
		fail(t, s, c, dedup.Failure{Error: "failed", TTL: ttl})
	case dedup.StatusFailedFinal:
		fail(t, s, c, dedup.Failure{Final: true, Error: "failed", TTL: ttl})
	}
}

// create makes a record for k with fingerprint "fp" in status, retained for
// ttl, under a long lease.
func create(t *testing.T, s dedup.Store, k dedup.Key, status dedup.Status, ttl time.Duration) {
	t.Helper()
	req := request(k, "fp")
	req.TTL = ttl
	settle(t, s, acquire(t, s, req), status, ttl)
}
