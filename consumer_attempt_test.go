package dedup_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
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

// lapsingStore fails every Complete until the claim's lease has lapsed, and
// the first one after that too: the store is down for longer than the
// lease. Nobody takes the claim over meanwhile.
type lapsingStore struct {
	dedup.Store
	lapsed atomic.Bool
}

func (s *lapsingStore) Complete(ctx context.Context, key dedup.Key, owner string, result []byte, ttl time.Duration) error {
	if s.lapsed.Load() {
		return s.Store.Complete(ctx, key, owner, result, ttl)
	}
	if rec, err := s.Store.Get(ctx, key); err == nil && time.Now().After(rec.LeaseUntil) {
		s.lapsed.Store(true)
	}
	return errUnreachable
}

// A store down for longer than the lease does not make a handler that
// succeeded run again: while the delivery is still held (its context
// lives), the wrapper keeps trying the fenced completion past the lease,
// and it lands, since nobody took the claim over.
func TestCompleteIsRetriedPastTheLease(t *testing.T) {
	store := &lapsingStore{Store: dedup.NewMemoryStore()}
	runs := 0
	w, err := dedup.Wrap(store, events, func(context.Context, event) error { runs++; return nil },
		dedup.WithScope(uniqueScope(t)), dedup.WithSink(dedup.NewMemorySink()), dedup.WithLease(500*time.Millisecond))
	require.NoError(t, err)
	res, err := w.Handle(context.Background(), event{ID: "e-1", Body: "b"})
	require.NoError(t, err)
	require.Equal(t, dedup.OutcomeProcessed, res.Outcome)
	require.True(t, store.lapsed.Load(), "the completion landed before the lease lapsed")
	res, err = w.Handle(context.Background(), event{ID: "e-1", Body: "b"})
	require.NoError(t, err)
	require.Equal(t, dedup.OutcomeDuplicate, res.Outcome)
	require.Equal(t, 1, runs)
}

// downStore fails every Complete, and at the third reads the wrapper's
// health, then cancels the delivery's context: the transport may give the
// message to another consumer now (a Kafka partition revoked).
type downStore struct {
	dedup.Store
	calls   atomic.Int32
	release context.CancelFunc
	health  func() error
	during  error // the health read at the third call
}

func (s *downStore) Complete(context.Context, dedup.Key, string, []byte, time.Duration) error {
	if s.calls.Add(1) == 3 {
		s.during = s.health()
		s.release()
	}
	return errUnreachable
}

// While the wrapper retries a completion, Health reports the outage. Once
// the delivery is no longer held, the wrapper gives up on recording the
// success, and says that its effect may run again: an ERROR naming the key
// and dedup.outcomes_unrecorded.
func TestUnrecordedOutcomeIsReported(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := &downStore{Store: dedup.NewMemoryStore(), release: cancel}
	var logs bytes.Buffer
	tel := newTelemetry(t)
	w, err := dedup.Wrap(store, events, func(context.Context, event) error { return nil },
		dedup.WithScope("unrecorded"), dedup.WithSink(dedup.NewMemorySink()), dedup.WithMeterProvider(tel.mp),
		dedup.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), dedup.WithOutageThreshold(time.Nanosecond))
	require.NoError(t, err)
	store.health = w.Health
	_, err = w.Handle(ctx, event{ID: "e-1", Body: "b"})
	require.ErrorIs(t, err, errUnreachable)
	require.Equal(t, int32(3), store.calls.Load(), "tries after the delivery's context ended")
	require.ErrorIs(t, store.during, dedup.ErrOutage, "Health while the completion was retried")
	require.Contains(t, logs.String(), `level=ERROR msg="dedup: outcome not recorded after the handler succeeded; its effect may run again when the event is redelivered" key=unrecorded/e-1`)
	require.Equal(t, int64(1), tel.counter(t, "dedup.outcomes_unrecorded"))
}
