package dedup_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
)

// A delivery whose key another worker holds is tried again within a second,
// however long the holder's lease: the holder is usually about to settle it,
// and a Kafka partition waits in place meanwhile. (It waited for the whole
// lease, which stalled partitions for the lease on every duplicate racing
// its original: found by the DynamoDB outage campaign in reliability/.)
func TestInFlightIsTriedAgainSoon(t *testing.T) {
	store, scope := dedup.NewMemoryStore(), uniqueScope(t)
	fp, err := dedup.SHA256Fingerprint()([]byte("b"))
	require.NoError(t, err)
	_, err = store.Claim(context.Background(), dedup.ClaimRequest{
		Key: dedup.Key{Scope: scope, EventID: "e-1"}, Fingerprint: fp, Lease: time.Minute, TTL: time.Hour,
	})
	require.NoError(t, err)
	w, err := dedup.Wrap(store, events, func(context.Context, event) error { return nil },
		dedup.WithScope(scope), dedup.WithSink(dedup.NewMemorySink()), dedup.WithLease(time.Minute))
	require.NoError(t, err)
	res, err := w.Handle(context.Background(), event{ID: "e-1", Body: "b"})
	require.NoError(t, err)
	require.Equal(t, dedup.OutcomeInFlight, res.Outcome)
	require.LessOrEqual(t, res.RetryAfter, time.Second)
	require.Positive(t, res.RetryAfter)
}
