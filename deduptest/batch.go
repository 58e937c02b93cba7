package deduptest

import (
	"fmt"
	"sync"
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
			// The claim's record is the one stored, the lease with it.
			requireSameRecord(t, get(t, s, reqs[i].Key), b.Record)
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

// testConcurrentBatches: batch claims of the same keys, made at once and
// each in an order of its own, acquire each key exactly once, and every
// refused claim sees the winner's record.
func testConcurrentBatches(t *testing.T, s dedup.Store) {
	const claimers, keys = 10, 60
	scope := newScope(t)
	ctx := ctxFor(t)
	start := make(chan struct{})
	reqs := make([][]dedup.ClaimRequest, claimers)
	claims := make([][]dedup.Claim, claimers)
	errs := make([]error, claimers)
	var wg sync.WaitGroup
	for c := range claimers {
		reqs[c] = make([]dedup.ClaimRequest, keys)
		for i := range keys {
			reqs[c][i] = request(key(scope, fmt.Sprintf("evt-%02d", (i*7+c*11)%keys)), "fp")
		}
		wg.Go(func() {
			<-start
			claims[c], errs[c] = s.ClaimBatch(ctx, reqs[c])
		})
	}
	close(start)
	wg.Wait()

	winners := map[dedup.Key]string{}
	for c := range claimers {
		require.NoError(t, errs[c], "claimer %d", c)
		require.Len(t, claims[c], keys)
		for i, cl := range claims[c] {
			require.Equal(t, reqs[c][i].Key, cl.Record.Key, "claimer %d, claim %d", c, i)
			if cl.Status == dedup.ClaimAcquired {
				_, taken := winners[cl.Record.Key]
				require.False(t, taken, "%s acquired twice", cl.Record.Key)
				winners[cl.Record.Key] = cl.Record.Owner
			}
		}
	}
	require.Len(t, winners, keys, "every key acquired once")
	for c := range claimers {
		for _, cl := range claims[c] {
			if cl.Status != dedup.ClaimAcquired {
				require.Equal(t, dedup.ClaimInFlight, cl.Status, "%s", cl.Record.Key)
				require.Equal(t, winners[cl.Record.Key], cl.Record.Owner, "%s: the winner's record", cl.Record.Key)
			}
		}
	}
	for k, owner := range winners {
		rec := get(t, s, k)
		require.Equal(t, owner, rec.Owner, "%s", k)
		require.Equal(t, 1, rec.Attempts, "%s", k)
	}
}
