package deduptest

import (
	"fmt"
	"testing"

	"github.com/dedupkit/dedup"
	"github.com/stretchr/testify/require"
)

func claimBatch(t *testing.T, s dedup.Store, reqs []dedup.ClaimRequest) []dedup.Claim {
	t.Helper()
	claims, err := s.ClaimBatch(ctxFor(t), reqs)
	require.NoError(t, err)
	require.Len(t, claims, len(reqs))
	for i, c := range claims {
		require.Equal(t, reqs[i].Key, c.Record.Key, "claim %d answers request %d", i, i)
	}
	return claims
}

// testBatchRepeatedKeyRejected: a batch claim takes distinct keys; one
// that repeats a key fails whole and writes nothing.
func testBatchRepeatedKeyRejected(t *testing.T, s dedup.Store) {
	scope := newScope(t)
	require.Empty(t, claimBatch(t, s, nil), "an empty batch claims nothing")

	k1, k2 := key(scope, "evt-1"), key(scope, "evt-2")
	_, err := s.ClaimBatch(ctxFor(t), []dedup.ClaimRequest{request(k1, "fp"), request(k2, "fp"), request(k1, "fp")})
	require.Error(t, err, "a repeated key fails the batch")
	for _, k := range []dedup.Key{k1, k2} {
		_, err := s.Get(ctxFor(t), k)
		require.ErrorIs(t, err, dedup.ErrNotFound, "nothing was written for %s", k)
	}
}

// The mixed batch of testBatchMatchesSingleClaims: 500 requests over keys
// that are half succeeded beforehand, the rest retryable, final, in flight or
// absent; some carry another fingerprint.
const batchSize = 500

func batchKey(scope string, i int) dedup.Key {
	return key(scope, fmt.Sprintf("evt-%03d", i))
}

func batchRequest(scope string, i int) dedup.ClaimRequest {
	fp := "fp"
	if i%13 == 5 {
		fp = "other"
	}
	return request(batchKey(scope, i), fp)
}

// batchStatusBefore is the status key i holds before the batch, or "" for
// absent.
func batchStatusBefore(i int) dedup.Status {
	switch {
	case i%2 == 0:
		return dedup.StatusSucceeded
	case i%8 == 1:
		return dedup.StatusFailedRetryable
	case i%8 == 3:
		return dedup.StatusFailedFinal
	case i%8 == 5:
		return dedup.StatusProcessing
	}
	return ""
}

// prepareBatch gives scope the records batchStatusBefore describes.
func prepareBatch(t *testing.T, s dedup.Store, scope string) {
	t.Helper()
	var reqs []dedup.ClaimRequest
	var status []dedup.Status
	for i := range batchSize {
		if st := batchStatusBefore(i); st != "" {
			reqs = append(reqs, request(key(scope, fmt.Sprintf("evt-%03d", i)), "fp"))
			status = append(status, st)
		}
	}
	for i, c := range claimBatch(t, s, reqs) {
		require.Equal(t, dedup.ClaimAcquired, c.Status, "setup claim %s", c.Record.Key)
		settle(t, s, c, status[i], longTTL)
	}
}

func testBatchMatchesSingleClaims(t *testing.T, s dedup.Store) {
	batchScope, singleScope := newScope(t), newScope(t)
	prepareBatch(t, s, batchScope)
	prepareBatch(t, s, singleScope)

	reqs := make([]dedup.ClaimRequest, batchSize)
	for i := range reqs {
		reqs[i] = batchRequest(batchScope, i)
	}
	batch := claimBatch(t, s, reqs)

	seen := map[dedup.ClaimStatus]int{}
	takeovers := 0
	for i := range batchSize {
		single := claim(t, s, batchRequest(singleScope, i))
		b := batch[i]
		require.Equal(t, single.Status, b.Status, "request %d (%s)", i, reqs[i].Key.EventID)
		require.Equal(t, single.Previous, b.Previous, "request %d", i)
		require.Equal(t, single.Record.Status, b.Record.Status, "request %d", i)
		require.Equal(t, single.Record.Fingerprint, b.Record.Fingerprint, "request %d", i)
		require.Equal(t, single.Record.Attempts, b.Record.Attempts, "request %d", i)
		seen[b.Status]++
		if b.Status == dedup.ClaimAcquired {
			require.Equal(t, b.Record.Owner, get(t, s, reqs[i].Key).Owner, "request %d holds the lease", i)
			if b.Previous == dedup.StatusFailedRetryable {
				takeovers++
			}
		}
	}
	for _, st := range []dedup.ClaimStatus{
		dedup.ClaimAcquired, dedup.ClaimDuplicate, dedup.ClaimInFlight, dedup.ClaimConflict, dedup.ClaimFinal,
	} {
		require.Positive(t, seen[st], "the batch exercises %v", st)
	}
	require.Positive(t, takeovers, "the batch takes over retryable failures")
}
