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

func testBatchSameKeyTwice(t *testing.T, s dedup.Store) {
	scope := newScope(t)
	require.Empty(t, claimBatch(t, s, nil), "an empty batch claims nothing")

	k1, k2, k3 := key(scope, "evt-1"), key(scope, "evt-2"), key(scope, "evt-3")
	claims := claimBatch(t, s, []dedup.ClaimRequest{
		request(k1, "fp"), request(k1, "fp"),
		request(k2, "fp"), request(k2, "other"),
		request(k3, "fp"),
	})
	want := []dedup.ClaimStatus{
		dedup.ClaimAcquired, dedup.ClaimInFlight,
		dedup.ClaimAcquired, dedup.ClaimConflict,
		dedup.ClaimAcquired,
	}
	for i, c := range claims {
		require.Equal(t, want[i], c.Status, "request %d", i)
	}
	require.Equal(t, claims[0].Record.Owner, claims[1].Record.Owner, "the second sees the first's claim")
	require.Equal(t, claims[0].Record.Owner, get(t, s, k1).Owner)
	require.Equal(t, 1, get(t, s, k1).Attempts)
	require.Equal(t, "fp", get(t, s, k2).Fingerprint)
}

// The mixed batch of testBatchMatchesSingleClaims: 500 requests over keys
// that are half succeeded beforehand, the rest retryable, final, in flight or
// absent; every tenth request repeats an earlier key and some carry another
// fingerprint.
const batchSize = 500

func batchKey(scope string, i int) dedup.Key {
	if i%10 == 9 {
		i -= 2 // a repeat within the batch, of a key that was not succeeded
	}
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
		if st := batchStatusBefore(i); st != "" && i%10 != 9 {
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
