package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// event is the message type of these tests: what a transport would deliver.
type event struct {
	ID   string
	Body string
	Hint int // the transport's own delivery count, when it has one
}

var events = dedup.Messages[event]{
	EventID: func(e event) (string, error) {
		if e.ID == "" {
			return "", errors.New("no event-id header")
		}
		return e.ID, nil
	},
	Payload: func(e event) []byte { return []byte(e.Body) },
	DeadLetter: func(e event) dedup.DeadLetter {
		return dedup.DeadLetter{Payload: []byte(e.Body), Headers: []dedup.Header{{Key: "h", Value: []byte("v")}}}
	},
	Attempts: func(e event) int { return e.Hint },
}

// stores returns the backends the wrapper tests run on.
func stores() map[string]func(t *testing.T) dedup.Store {
	return map[string]func(t *testing.T) dedup.Store{
		"memory":   func(t *testing.T) dedup.Store { return dedup.NewMemoryStore() },
		"postgres": func(t *testing.T) dedup.Store { return newPostgresStore(t, testenv.Postgres(t)) },
	}
}

func newPostgresStore(t testing.TB, pool *pgxpool.Pool) *dedup.PostgresStore {
	t.Helper()
	s, err := dedup.NewPostgresStore(pool, dedup.WithTable("dedup_wrapper_test"))
	require.NoError(t, err)
	require.NoError(t, s.Migrate(context.Background()))
	return s
}

func uniqueScope(t testing.TB) string {
	return fmt.Sprintf("%s/%d", t.Name(), time.Now().UnixNano())
}

func fastOpts(t testing.TB, sink dedup.Sink, extra ...dedup.Opt) []dedup.Opt {
	return append([]dedup.Opt{
		dedup.WithScope(uniqueScope(t)),
		dedup.WithSink(sink),
		dedup.WithBackoff(dedup.ExponentialBackoff(time.Millisecond, 5*time.Millisecond)),
	}, extra...)
}

// deliverUntilSettled redelivers like a transport: until the outcome may be
// acknowledged.
func deliverUntilSettled[M any](t *testing.T, w *dedup.Wrapper[M], msg M) dedup.Result {
	t.Helper()
	for i := 0; i < 50; i++ {
		res, err := w.Handle(context.Background(), msg)
		require.NoError(t, err)
		if res.Settled() {
			return res
		}
		time.Sleep(res.RetryAfter)
	}
	t.Fatal("never settled")
	return dedup.Result{}
}

func TestWrapper(t *testing.T) {
	for name, newStore := range stores() {
		t.Run(name, func(t *testing.T) {
			t.Run("FailsTwiceThenSucceeds", func(t *testing.T) {
				store, sink := newStore(t), dedup.NewMemorySink()
				var calls, effects atomic.Int32
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
					if calls.Add(1) <= 2 {
						return errors.New("downstream timeout")
					}
					effects.Add(1)
					return nil
				}, fastOpts(t, sink)...)
				require.NoError(t, err)

				res := deliverUntilSettled(t, w, event{ID: "e1", Body: "pay 10"})
				require.Equal(t, dedup.OutcomeProcessed, res.Outcome)
				require.Equal(t, 3, res.Attempts)
				for i := 0; i < 3; i++ { // redeliveries after success
					res, err := w.Handle(context.Background(), event{ID: "e1", Body: "pay 10"})
					require.NoError(t, err)
					require.Equal(t, dedup.OutcomeDuplicate, res.Outcome)
				}
				require.EqualValues(t, 1, effects.Load())
				require.EqualValues(t, 3, calls.Load())
				rec, err := store.Get(context.Background(), res.Key)
				require.NoError(t, err)
				require.Equal(t, dedup.StatusSucceeded, rec.Status)
				require.Equal(t, 3, rec.Attempts)
				require.Empty(t, sink.Letters())
			})

			t.Run("AlwaysFailsIsDeadLetteredAfterMaxAttempts", func(t *testing.T) {
				store, sink := newStore(t), dedup.NewMemorySink()
				var calls atomic.Int32
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
					calls.Add(1)
					return fmt.Errorf("charge: %w", errors.New("card declined"))
				}, fastOpts(t, sink, dedup.WithMaxAttempts(4))...)
				require.NoError(t, err)

				res := deliverUntilSettled(t, w, event{ID: "poison", Body: "x"})
				require.Equal(t, dedup.OutcomeDeadLettered, res.Outcome)
				require.Equal(t, dedup.ReasonHandlerError, res.Reason)
				require.EqualValues(t, 4, calls.Load())

				letters := sink.Letters()
				require.Len(t, letters, 1)
				dl := letters[0]
				require.Equal(t, dedup.ReasonHandlerError, dl.Reason)
				require.Equal(t, "charge: card declined", dl.Error)
				require.Equal(t, "card declined", dl.Cause)
				require.Equal(t, 4, dl.Attempts)
				require.Equal(t, "poison", dl.EventID)
				require.Equal(t, w.Scope(), dl.Scope)
				require.Equal(t, []byte("x"), dl.Payload)
				require.False(t, dl.FirstFailure.IsZero())
				require.False(t, dl.LastFailure.Before(dl.FirstFailure))

				// Parked for good: a redelivery is acknowledged, not run.
				res, err = w.Handle(context.Background(), event{ID: "poison", Body: "x"})
				require.NoError(t, err)
				require.Equal(t, dedup.OutcomeDuplicate, res.Outcome)
				require.EqualValues(t, 4, calls.Load())
				rec, err := store.Get(context.Background(), res.Key)
				require.NoError(t, err)
				require.Equal(t, dedup.StatusFailedFinal, rec.Status)
			})

			t.Run("PermanentIsDeadLetteredAtFirstAttempt", func(t *testing.T) {
				store, sink := newStore(t), dedup.NewMemorySink()
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
					return dedup.Permanent(errors.New("schema v9 unsupported"))
				}, fastOpts(t, sink)...)
				require.NoError(t, err)
				res, err := w.Handle(context.Background(), event{ID: "p", Body: "x"})
				require.NoError(t, err)
				require.Equal(t, dedup.OutcomeDeadLettered, res.Outcome)
				require.Equal(t, dedup.ReasonPermanent, res.Reason)
				require.Equal(t, 1, res.Attempts)
				require.Len(t, sink.Letters(), 1)
				require.Equal(t, "schema v9 unsupported", sink.Letters()[0].Cause)
			})

			t.Run("PanicIsCountedAsFailedAttempt", func(t *testing.T) {
				store, sink := newStore(t), dedup.NewMemorySink()
				var calls atomic.Int32
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
					if calls.Add(1) == 1 {
						panic(fmt.Sprintf("corrupt state in %s", e.ID))
					}
					return nil
				}, fastOpts(t, sink)...)
				require.NoError(t, err)
				res, err := w.Handle(context.Background(), event{ID: "pn", Body: "x"})
				require.NoError(t, err)
				require.Equal(t, dedup.OutcomeRetry, res.Outcome)
				var perr *dedup.PanicError
				require.ErrorAs(t, res.Err, &perr)
				rec, err := store.Get(context.Background(), res.Key)
				require.NoError(t, err)
				require.Equal(t, dedup.StatusFailedRetryable, rec.Status)
				require.Contains(t, rec.LastError, "panicked")
				res = deliverUntilSettled(t, w, event{ID: "pn", Body: "x"})
				require.Equal(t, dedup.OutcomeProcessed, res.Outcome)
				require.Equal(t, 2, res.Attempts)
			})

			t.Run("PanicOnLastAttemptIsDeadLetteredAsPanic", func(t *testing.T) {
				store, sink := newStore(t), dedup.NewMemorySink()
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
					panic("corrupt state")
				}, fastOpts(t, sink, dedup.WithMaxAttempts(1))...)
				require.NoError(t, err)
				res, err := w.Handle(context.Background(), event{ID: "pl", Body: "x"})
				require.NoError(t, err)
				require.Equal(t, dedup.OutcomeDeadLettered, res.Outcome)
				require.Equal(t, dedup.ReasonPanic, sink.Letters()[0].Reason)
			})

			t.Run("InvalidIDIsDeadLetteredAndNothingWritten", func(t *testing.T) {
				store, sink := newStore(t), dedup.NewMemorySink()
				var calls atomic.Int32
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
					calls.Add(1)
					return nil
				}, fastOpts(t, sink)...)
				require.NoError(t, err)
				for _, id := range []string{"", "has\nnewline", string(make([]byte, 256))} {
					res, err := w.Handle(context.Background(), event{ID: id, Body: "x"})
					require.NoError(t, err)
					require.Equal(t, dedup.OutcomeDeadLettered, res.Outcome)
					require.Equal(t, dedup.ReasonInvalidID, res.Reason)
				}
				require.Zero(t, calls.Load())
				letters := sink.Letters()
				require.Len(t, letters, 3)
				for _, dl := range letters {
					require.Equal(t, dedup.ReasonInvalidID, dl.Reason)
					require.NotEmpty(t, dl.Error)
				}
			})

			t.Run("SameIDOtherPayloadIsConflict", func(t *testing.T) {
				store, sink := newStore(t), dedup.NewMemorySink()
				var effects atomic.Int32
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
					effects.Add(1)
					return nil
				}, fastOpts(t, sink)...)
				require.NoError(t, err)
				res, err := w.Handle(context.Background(), event{ID: "c", Body: "pay 10"})
				require.NoError(t, err)
				require.Equal(t, dedup.OutcomeProcessed, res.Outcome)
				res, err = w.Handle(context.Background(), event{ID: "c", Body: "pay 9999"})
				require.NoError(t, err)
				require.Equal(t, dedup.OutcomeConflict, res.Outcome)
				require.ErrorIs(t, res.Err, dedup.ErrFingerprintConflict)
				require.EqualValues(t, 1, effects.Load())
				require.Len(t, sink.Letters(), 1)
				require.Equal(t, dedup.ReasonConflict, sink.Letters()[0].Reason)
				require.Equal(t, []byte("pay 9999"), sink.Letters()[0].Payload)
				rec, err := store.Get(context.Background(), res.Key)
				require.NoError(t, err)
				require.Equal(t, dedup.StatusSucceeded, rec.Status, "the original event's record is untouched")
			})

			t.Run("FailingSinkAcksNothingThenRecovers", func(t *testing.T) {
				store, sink := newStore(t), deduptest.NewFailingSink()
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
					return dedup.Permanent(errors.New("bad"))
				}, fastOpts(t, sink)...)
				require.NoError(t, err)
				sink.FailWith(errors.New("dlq down"))
				res, err := w.Handle(context.Background(), event{ID: "s", Body: "x"})
				require.Error(t, err)
				require.False(t, res.Settled())
				sink.FailWith(nil)
				res = deliverUntilSettled(t, w, event{ID: "s", Body: "x"})
				require.Equal(t, dedup.OutcomeDeadLettered, res.Outcome)
				require.Len(t, sink.Letters(), 1)
			})

			t.Run("CrashLoopIsDeadLettered", func(t *testing.T) {
				store, sink := newStore(t), dedup.NewMemorySink()
				var calls atomic.Int32
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
					calls.Add(1)
					return nil
				}, fastOpts(t, sink, dedup.WithMaxAttempts(2))...)
				require.NoError(t, err)
				// Two workers claimed the event and died mid-handler.
				req := dedup.ClaimRequest{Key: dedup.Key{Scope: w.Scope(), EventID: "crash"},
					Fingerprint: mustFingerprint(t, "x"), Lease: 50 * time.Millisecond, TTL: time.Hour}
				for i := 0; i < 2; i++ {
					c, err := store.Claim(context.Background(), req)
					require.NoError(t, err)
					require.Equal(t, dedup.ClaimAcquired, c.Status)
					time.Sleep(120 * time.Millisecond)
				}
				res, err := w.Handle(context.Background(), event{ID: "crash", Body: "x"})
				require.NoError(t, err)
				require.Equal(t, dedup.OutcomeDeadLettered, res.Outcome)
				require.Equal(t, dedup.ReasonCrashLoop, res.Reason)
				require.Zero(t, calls.Load())
				require.Equal(t, 3, sink.Letters()[0].Attempts)
			})

			t.Run("TransportHintCountsTowardMaxAttempts", func(t *testing.T) {
				store, sink := newStore(t), dedup.NewMemorySink()
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
					return errors.New("nope")
				}, fastOpts(t, sink, dedup.WithMaxAttempts(3))...)
				require.NoError(t, err)
				res, err := w.Handle(context.Background(), event{ID: "hint", Body: "x", Hint: 3})
				require.NoError(t, err)
				require.Equal(t, dedup.OutcomeDeadLettered, res.Outcome)
				require.Equal(t, 3, res.Attempts)
			})

			t.Run("NilAfterCanceledContextIsTrustedAndRecorded", func(t *testing.T) {
				store, sink := newStore(t), dedup.NewMemorySink()
				ctx, cancel := context.WithCancel(context.Background())
				var effects atomic.Int32
				w, err := dedup.Wrap(store, events, func(hctx context.Context, e event) error {
					effects.Add(1) // the effect happened...
					cancel()       // ...as the worker began shutting down
					<-hctx.Done()
					return nil
				}, fastOpts(t, sink)...)
				require.NoError(t, err)
				res, err := w.Handle(ctx, event{ID: "cx", Body: "x"})
				require.NoError(t, err)
				require.Equal(t, dedup.OutcomeProcessed, res.Outcome)
				rec, err := store.Get(context.Background(), res.Key)
				require.NoError(t, err)
				require.Equal(t, dedup.StatusSucceeded, rec.Status, "recorded although ctx was done, so it never runs twice")
				res, err = w.Handle(context.Background(), event{ID: "cx", Body: "x"})
				require.NoError(t, err)
				require.Equal(t, dedup.OutcomeDuplicate, res.Outcome)
				require.EqualValues(t, 1, effects.Load())
			})

			t.Run("HeartbeatKeepsLeaseOfSlowHandler", func(t *testing.T) {
				store, sink := newStore(t), dedup.NewMemorySink()
				started := make(chan struct{})
				release := make(chan struct{})
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
					close(started)
					<-release
					return nil
				}, fastOpts(t, sink, dedup.WithLease(300*time.Millisecond))...)
				require.NoError(t, err)
				done := make(chan dedup.Result)
				go func() {
					res, _ := w.Handle(context.Background(), event{ID: "slow", Body: "x"})
					done <- res
				}()
				<-started
				time.Sleep(time.Second) // over three leases
				res, err := w.Handle(context.Background(), event{ID: "slow", Body: "x"})
				require.NoError(t, err)
				require.Equal(t, dedup.OutcomeInFlight, res.Outcome, "the lease is still held")
				close(release)
				require.Equal(t, dedup.OutcomeProcessed, (<-done).Outcome)
			})

			t.Run("LostLeaseCancelsHandlerAndIsReported", func(t *testing.T) {
				store, sink := newStore(t), dedup.NewMemorySink()
				started := make(chan struct{})
				var cause error
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
					close(started)
					<-ctx.Done()
					cause = context.Cause(ctx)
					return ctx.Err()
				}, fastOpts(t, sink, dedup.WithLease(300*time.Millisecond))...)
				require.NoError(t, err)
				key := dedup.Key{Scope: w.Scope(), EventID: "stolen"}
				errc := make(chan error)
				go func() {
					_, err := w.Handle(context.Background(), event{ID: "stolen", Body: "x"})
					errc <- err
				}()
				<-started
				// Another owner takes the record over behind the heartbeat's back.
				rec, err := store.Get(context.Background(), key)
				require.NoError(t, err)
				require.NoError(t, store.Fail(context.Background(), key, rec.Owner, dedup.Failure{Error: "taken", TTL: time.Hour}))
				c, err := store.Claim(context.Background(), dedup.ClaimRequest{Key: key, Fingerprint: rec.Fingerprint, Lease: time.Minute, TTL: time.Hour})
				require.NoError(t, err)
				require.Equal(t, dedup.ClaimAcquired, c.Status)
				err = <-errc
				require.ErrorIs(t, err, dedup.ErrLeaseLost)
				require.ErrorIs(t, cause, dedup.ErrLeaseLost)
				got, gerr := store.Get(context.Background(), key)
				require.NoError(t, gerr)
				require.Equal(t, c.Record.Owner, got.Owner, "the new owner's record is untouched")
				require.Equal(t, dedup.StatusProcessing, got.Status)
			})

			t.Run("ConcurrentDeliveriesRunOnce", func(t *testing.T) {
				store, sink := newStore(t), dedup.NewMemorySink()
				var effects atomic.Int32
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
					effects.Add(1)
					time.Sleep(20 * time.Millisecond)
					return nil
				}, fastOpts(t, sink)...)
				require.NoError(t, err)
				var wg sync.WaitGroup
				start := make(chan struct{})
				for i := 0; i < 50; i++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						for {
							res, err := w.Handle(context.Background(), event{ID: "hot", Body: "x"})
							if err != nil || res.Settled() {
								return
							}
							time.Sleep(10 * time.Millisecond)
						}
					}()
				}
				close(start)
				wg.Wait()
				require.EqualValues(t, 1, effects.Load())
			})

			t.Run("BatchAnswersAsSingles", func(t *testing.T) {
				store, sink := newStore(t), dedup.NewMemorySink()
				var mu sync.Mutex
				ran := map[string]int{}
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
					mu.Lock()
					defer mu.Unlock()
					ran[e.ID]++
					if e.Body == "fail" {
						return dedup.Permanent(errors.New("bad"))
					}
					return nil
				}, fastOpts(t, sink)...)
				require.NoError(t, err)
				batch := []event{{ID: "a", Body: "1"}, {ID: "b", Body: "fail"}, {ID: "a", Body: "1"}, {ID: "", Body: "no id"}, {ID: "c", Body: "1"}, {ID: "a", Body: "other"}}
				var outcomes []dedup.Outcome
				err = w.HandleBatch(context.Background(), batch, func(i int, res dedup.Result, err error) bool {
					require.NoError(t, err)
					require.Len(t, outcomes, i, "in order")
					outcomes = append(outcomes, res.Outcome)
					return true
				})
				require.NoError(t, err)
				require.Equal(t, []dedup.Outcome{dedup.OutcomeProcessed, dedup.OutcomeDeadLettered, dedup.OutcomeDuplicate, dedup.OutcomeDeadLettered, dedup.OutcomeProcessed, dedup.OutcomeConflict}, outcomes)
				require.Equal(t, map[string]int{"a": 1, "b": 1, "c": 1}, ran)
			})

			t.Run("BatchStoppedEarlyReleasesUnstartedClaims", func(t *testing.T) {
				store, sink := newStore(t), dedup.NewMemorySink()
				var calls atomic.Int32
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
					calls.Add(1)
					return nil
				}, fastOpts(t, sink, dedup.WithLease(time.Minute), dedup.WithBatchCompletion(0))...)
				require.NoError(t, err)
				// (With completions written together, the batch's handlers
				// have all run by the time the first result is given.)
				batch := []event{{ID: "r1", Body: "x"}, {ID: "r2", Body: "x"}, {ID: "r3", Body: "x"}}
				err = w.HandleBatch(context.Background(), batch, func(i int, res dedup.Result, err error) bool {
					return false // a rebalance: stop after the first
				})
				require.NoError(t, err)
				require.EqualValues(t, 1, calls.Load())
				// The unstarted ones are claimable at once, attempts not counted.
				for _, id := range []string{"r2", "r3"} {
					res, err := w.Handle(context.Background(), event{ID: id, Body: "x"})
					require.NoError(t, err)
					require.Equal(t, dedup.OutcomeProcessed, res.Outcome)
					require.Equal(t, 1, res.Attempts)
				}
			})
		})
	}
}

func mustFingerprint(t testing.TB, body string) string {
	fp, err := dedup.SHA256Fingerprint()([]byte(body))
	require.NoError(t, err)
	return fp
}

func TestWrapRejectsBadConfig(t *testing.T) {
	store, sink := dedup.NewMemoryStore(), dedup.NewMemorySink()
	h := func(ctx context.Context, e event) error { return nil }
	cases := map[string][]dedup.Opt{
		"no scope":        {dedup.WithSink(sink)},
		"no sink":         {dedup.WithScope("s")},
		"bad scope":       {dedup.WithScope("a\x00b"), dedup.WithSink(sink)},
		"zero attempts":   {dedup.WithScope("s"), dedup.WithSink(sink), dedup.WithMaxAttempts(0)},
		"negative ttl":    {dedup.WithScope("s"), dedup.WithSink(sink), dedup.WithTTL(-time.Second)},
		"negative lease":  {dedup.WithScope("s"), dedup.WithSink(sink), dedup.WithLease(-time.Second)},
		"nil fingerprint": {dedup.WithScope("s"), dedup.WithSink(sink), dedup.WithFingerprint(nil)},
	}
	for name, opts := range cases {
		_, err := dedup.Wrap(store, events, h, opts...)
		require.ErrorIs(t, err, dedup.ErrConfig, name)
	}
	_, err := dedup.Wrap[event](store, dedup.Messages[event]{}, h, dedup.WithScope("s"), dedup.WithSink(sink))
	require.ErrorIs(t, err, dedup.ErrConfig)
	_, err = dedup.Wrap[event](nil, events, h, dedup.WithScope("s"), dedup.WithSink(sink))
	require.ErrorIs(t, err, dedup.ErrConfig)
}

// A nil pointer behind an interface (what a constructor whose error was
// ignored returns) is refused where it is given, never a panic at first use.
func TestTypedNilsAreRefused(t *testing.T) {
	h := func(ctx context.Context, e event) error { return nil }
	sink := dedup.NewMemorySink()
	pg, err := dedup.NewPostgresStore(nil)
	require.ErrorIs(t, err, dedup.ErrConfig, "NewPostgresStore(nil pool)")
	require.Nil(t, pg)
	ddb, err := dedup.NewDynamoDBStore(nil, dedup.WithTable("table"))
	require.ErrorIs(t, err, dedup.ErrConfig, "NewDynamoDBStore(nil client)")
	require.Nil(t, ddb)
	_, err = dedup.NewPostgresStore(testenv.Postgres(t), dedup.WithTable("no such; table"))
	require.ErrorIs(t, err, dedup.ErrConfig, "a bad table name")

	for name, store := range map[string]dedup.Store{
		"*PostgresStore": (*dedup.PostgresStore)(nil),
		"*DynamoDBStore": (*dedup.DynamoDBStore)(nil),
		"*MemoryStore":   (*dedup.MemoryStore)(nil),
		"PostgresStore from NewPostgresStore(nil)": pg,
	} {
		w, err := dedup.Wrap(store, events, h, dedup.WithScope("s"), dedup.WithSink(sink))
		require.ErrorIs(t, err, dedup.ErrConfig, name)
		require.Nil(t, w, name)
	}
	_, err = dedup.WrapTx(pg, events, func(context.Context, pgx.Tx, event) error { return nil },
		dedup.WithScope("s"), dedup.WithSink(sink))
	require.ErrorIs(t, err, dedup.ErrConfig, "WrapTx over a typed nil")
	_, err = dedup.Wrap(dedup.NewMemoryStore(), events, h, dedup.WithScope("s"), dedup.WithSink((*dedup.MemorySink)(nil)))
	require.ErrorIs(t, err, dedup.ErrConfig, "a typed-nil sink")
	_, err = dedup.Wrap(dedup.NewMemoryStore(), events, h, dedup.WithScope("s"), dedup.WithSink(sink), dedup.WithLogger(nil))
	require.ErrorIs(t, err, dedup.ErrConfig, "a nil logger")
}

// TestStoreUnreachable proves that when the store cannot be reached the
// wrapper returns an error, nothing is acknowledged and the handler does not
// run, and that it recovers once the database is back.
func TestStoreUnreachable(t *testing.T) {
	ctx := context.Background()
	t.Run("ClosedPort", func(t *testing.T) {
		pool, err := pgxpool.New(ctx, "postgres://postgres@"+testenv.ClosedPort(t)+"/test?connect_timeout=1")
		require.NoError(t, err)
		defer pool.Close()
		store, err := dedup.NewPostgresStore(pool)
		require.NoError(t, err)
		var calls atomic.Int32
		w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
			calls.Add(1)
			return nil
		}, fastOpts(t, dedup.NewMemorySink())...)
		require.NoError(t, err)
		res, err := w.Handle(ctx, event{ID: "u", Body: "x"})
		require.Error(t, err)
		require.False(t, res.Settled())
		require.Zero(t, calls.Load())
	})

	t.Run("ServerStoppedAndStarted", func(t *testing.T) {
		srv := testenv.StartPostgresServer(t)
		pool, err := pgxpool.New(ctx, srv.DSN())
		require.NoError(t, err)
		defer pool.Close()
		store := newPostgresStore(t, pool)
		var effects atomic.Int32
		w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
			effects.Add(1)
			return nil
		}, fastOpts(t, dedup.NewMemorySink())...)
		require.NoError(t, err)

		res, err := w.Handle(ctx, event{ID: "before", Body: "x"})
		require.NoError(t, err)
		require.Equal(t, dedup.OutcomeProcessed, res.Outcome)

		srv.Stop()
		for i := 0; i < 3; i++ {
			res, err = w.Handle(ctx, event{ID: "during-" + strconv.Itoa(i), Body: "x"})
			require.Error(t, err)
			require.False(t, res.Settled())
		}
		require.EqualValues(t, 1, effects.Load(), "no handler ran without a claim")

		srv.Start()
		for i := 0; i < 3; i++ {
			res = deliverUntilSettledTolerant(t, w, event{ID: "during-" + strconv.Itoa(i), Body: "x"})
			require.Equal(t, dedup.OutcomeProcessed, res.Outcome)
		}
		res, err = w.Handle(ctx, event{ID: "before", Body: "x"})
		require.NoError(t, err)
		require.Equal(t, dedup.OutcomeDuplicate, res.Outcome, "records written before the outage survive it")
		require.EqualValues(t, 4, effects.Load())
	})
}

// deliverUntilSettledTolerant redelivers through store errors, as a transport
// would while the database comes back.
func deliverUntilSettledTolerant[M any](t *testing.T, w *dedup.Wrapper[M], msg M) dedup.Result {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		res, err := w.Handle(context.Background(), msg)
		if err == nil && res.Settled() {
			return res
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("never settled")
	return dedup.Result{}
}

// A transport's lease hint (the SQS visibility timeout) is the lease unless
// WithLease overrides it.
func TestCallLease(t *testing.T) {
	store := dedup.NewMemoryStore()
	var leased time.Duration
	w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
		rec, err := store.Get(ctx, dedup.Key{Scope: "lease", EventID: e.ID})
		leased = time.Until(rec.LeaseUntil)
		return err
	}, dedup.WithScope("lease"), dedup.WithSink(dedup.NewMemorySink()))
	require.NoError(t, err)
	var res dedup.Result
	require.NoError(t, w.HandleBatch(context.Background(), []event{{ID: "l", Body: "x"}}, func(_ int, r dedup.Result, err error) bool {
		require.NoError(t, err)
		res = r
		return true
	}, dedup.CallLease(7*time.Minute)))
	require.Equal(t, dedup.OutcomeProcessed, res.Outcome)
	require.InDelta(t, (7 * time.Minute).Seconds(), leased.Seconds(), 5)
}

func TestScope(t *testing.T) {
	require.Equal(t, "billing/charge-card", dedup.Scope("billing", "charge-card"))
	// Scope checks nothing itself: WithScope refuses what is not a valid scope.
	_, err := dedup.Wrap(dedup.NewMemoryStore(), events, func(context.Context, event) error { return nil },
		dedup.WithScope(dedup.Scope("billing", "charge\x00")), dedup.WithSink(dedup.NewMemorySink()))
	require.ErrorIs(t, err, dedup.ErrConfig)
}
