package dedup_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
)

// blinkingStore fails its first failures Complete calls, as a store that is
// briefly unreachable does; with applyFirst, the first failing call is
// applied before its answer is lost.
type blinkingStore struct {
	dedup.Store
	failures   int32
	applyFirst bool
	calls      atomic.Int32
}

var errUnreachable = errors.New("store unreachable")

func (s *blinkingStore) Complete(ctx context.Context, key dedup.Key, owner string, result []byte, ttl time.Duration) error {
	n := s.calls.Add(1)
	if n > s.failures {
		return s.Store.Complete(ctx, key, owner, result, ttl)
	}
	if n == 1 && s.applyFirst {
		if err := s.Store.Complete(ctx, key, owner, result, ttl); err != nil {
			return err
		}
	}
	return errUnreachable
}

// A store that is unreachable for a moment when a handler has succeeded
// does not make the handler run again: the wrapper keeps trying to record
// the success while its claim holds. (It gave up at once, and the message's
// redelivery re-ran the handler once the lease lapsed: found by the
// DynamoDB outage campaign in reliability/.)
func TestCompleteIsRetriedWhileTheClaimHolds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store *blinkingStore
	}{
		{"unreachable", &blinkingStore{Store: dedup.NewMemoryStore(), failures: 3}},
		{"answer lost", &blinkingStore{Store: dedup.NewMemoryStore(), failures: 1, applyFirst: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runs := 0
			w, err := dedup.Wrap(tc.store, events, func(context.Context, event) error { runs++; return nil },
				dedup.WithScope(uniqueScope(t)), dedup.WithSink(dedup.NewMemorySink()), dedup.WithLease(5*time.Second))
			require.NoError(t, err)
			res, err := w.Handle(context.Background(), event{ID: "e-1", Body: "b"})
			require.NoError(t, err)
			require.Equal(t, dedup.OutcomeProcessed, res.Outcome)
			res, err = w.Handle(context.Background(), event{ID: "e-1", Body: "b"})
			require.NoError(t, err)
			require.Equal(t, dedup.OutcomeDuplicate, res.Outcome)
			require.Equal(t, 1, runs)
		})
	}
}

// The retries end with the lease: a store unreachable for longer leaves
// the message unacknowledged, with the store's error.
func TestCompleteRetriesEndWithTheLease(t *testing.T) {
	store := &blinkingStore{Store: dedup.NewMemoryStore(), failures: 1 << 30}
	w, err := dedup.Wrap(store, events, func(context.Context, event) error { return nil },
		dedup.WithScope(uniqueScope(t)), dedup.WithSink(dedup.NewMemorySink()), dedup.WithLease(time.Second))
	require.NoError(t, err)
	began := time.Now()
	_, err = w.Handle(context.Background(), event{ID: "e-1", Body: "b"})
	require.ErrorIs(t, err, errUnreachable)
	require.Less(t, time.Since(began), 2*time.Second)
	require.Greater(t, store.calls.Load(), int32(2))
}
