package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptest"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/testenv"
)

// concurrentDeliveries is how many deliveries of one event race in each case.
const concurrentDeliveries = 20

// concurrencyBackends are the stores the concurrency cases run on.
func concurrencyBackends() map[string]func(t *testing.T) dedup.Store {
	b := stores()
	b["dynamodb"] = func(t *testing.T) dedup.Store {
		s, _, _ := newDynamoDBStore(t)
		return s
	}
	return b
}

// attemptFigures are what a concurrency case counts, for its assertions and
// for RELIABILITY.md.
type attemptFigures struct {
	starts, letters, attempts, errs int
	outcomes                        map[dedup.Outcome]int
}

func (f attemptFigures) String() string {
	return fmt.Sprintf("handler starts %d, dead letters %d, record attempts %d, Handle errors %d, outcomes %v",
		f.starts, f.letters, f.attempts, f.errs, f.outcomes)
}

// raceDeliveries delivers msg from n goroutines at once, each redelivering
// like a transport until its delivery settles, and returns the outcomes and
// the number of Handle errors.
func raceDeliveries(t *testing.T, n int, handle func(context.Context, event) (dedup.Result, error), msg event) (map[dedup.Outcome]int, int) {
	t.Helper()
	var mu sync.Mutex
	outcomes := map[dedup.Outcome]int{}
	errs := 0
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			<-start
			for range 200 {
				res, err := handle(context.Background(), msg)
				if err != nil {
					mu.Lock()
					errs++
					mu.Unlock()
					t.Logf("Handle: %v", err)
					time.Sleep(10 * time.Millisecond)
					continue
				}
				if res.Settled() {
					mu.Lock()
					outcomes[res.Outcome]++
					mu.Unlock()
					return
				}
				time.Sleep(res.RetryAfter)
			}
			t.Error("a delivery never settled")
		})
	}
	close(start)
	wg.Wait()
	return outcomes, errs
}

// TestConcurrentFailingDeliveries races 20 deliveries of an event whose
// handler always fails: it must start at most MaxAttempts times, be parked
// exactly once, and its record must count every start.
func TestConcurrentFailingDeliveries(t *testing.T) {
	const maxAttempts = 3
	check := func(t *testing.T, store dedup.Store, sink *dedup.MemorySink, starts *atomic.Int32,
		handle func(context.Context, event) (dedup.Result, error), scope string) {
		msg := event{ID: "poison", Body: "x"}
		outcomes, errs := raceDeliveries(t, concurrentDeliveries, handle, msg)
		rec, err := store.Get(context.Background(), dedup.Key{Scope: scope, EventID: msg.ID})
		require.NoError(t, err)
		f := attemptFigures{starts: int(starts.Load()), letters: len(sink.Letters()), attempts: rec.Attempts,
			errs: errs, outcomes: outcomes}
		t.Log(f)
		require.LessOrEqual(t, f.starts, maxAttempts, "handler starts")
		require.Equal(t, 1, f.letters, "dead letters")
		require.Equal(t, f.starts, f.attempts, "the record counts every start")
		require.Equal(t, dedup.StatusFailedFinal, rec.Status)
		require.Zero(t, errs, "Handle errors")
		require.Equal(t, 1, outcomes[dedup.OutcomeDeadLettered])
		require.Equal(t, concurrentDeliveries-1, outcomes[dedup.OutcomeDuplicate])
	}
	for name, newStore := range concurrencyBackends() {
		t.Run(name, func(t *testing.T) {
			store, sink := newStore(t), dedup.NewMemorySink()
			var starts atomic.Int32
			scope := uniqueScope(t)
			w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
				starts.Add(1)
				time.Sleep(2 * time.Millisecond)
				return errors.New("downstream refused")
			}, dedup.WithScope(scope), dedup.WithSink(sink), dedup.WithMaxAttempts(maxAttempts),
				dedup.WithBackoff(dedup.ExponentialBackoff(time.Millisecond, 5*time.Millisecond)))
			require.NoError(t, err)
			check(t, store, sink, &starts, w.Handle, scope)
		})
	}
	t.Run("postgres-inbox", func(t *testing.T) {
		pool := testenv.Postgres(t)
		store, sink := newPostgresStore(t, pool), dedup.NewMemorySink()
		ledger := newLedger(t, pool)
		var starts atomic.Int32
		scope := uniqueScope(t)
		w, err := dedup.WrapTx(store, events, func(ctx context.Context, tx pgx.Tx, e event) error {
			starts.Add(1)
			if _, err := tx.Exec(ctx, `INSERT INTO `+ledger+` VALUES ($1, $2)`, e.ID, e.Body); err != nil {
				return err
			}
			time.Sleep(2 * time.Millisecond)
			return errors.New("downstream refused")
		}, dedup.WithScope(scope), dedup.WithSink(sink), dedup.WithMaxAttempts(maxAttempts),
			dedup.WithBackoff(dedup.ExponentialBackoff(time.Millisecond, 5*time.Millisecond)))
		require.NoError(t, err)
		check(t, store, sink, &starts, w.Handle, scope)
		require.Zero(t, countRows(t, pool, ledger, "poison"), "no failed attempt left an effect")
	})
}

// TestConcurrentInboxFailsTwiceThenSucceeds races 20 deliveries of an inbox
// event whose first two attempts fail: three starts, three attempts on the
// record, one effect, and no delivery told that its effect may be doubled.
func TestConcurrentInboxFailsTwiceThenSucceeds(t *testing.T) {
	pool := testenv.Postgres(t)
	store, sink := newPostgresStore(t, pool), dedup.NewMemorySink()
	ledger := newLedger(t, pool)
	var starts atomic.Int32
	scope := uniqueScope(t)
	w, err := dedup.WrapTx(store, events, func(ctx context.Context, tx pgx.Tx, e event) error {
		n := starts.Add(1)
		if _, err := tx.Exec(ctx, `INSERT INTO `+ledger+` VALUES ($1, $2)`, e.ID, e.Body); err != nil {
			return err
		}
		time.Sleep(2 * time.Millisecond)
		if n <= 2 {
			return errors.New("downstream refused")
		}
		return nil
	}, dedup.WithScope(scope), dedup.WithSink(sink), dedup.WithMaxAttempts(3),
		dedup.WithBackoff(dedup.ExponentialBackoff(time.Millisecond, 5*time.Millisecond)))
	require.NoError(t, err)
	outcomes, errs := raceDeliveries(t, concurrentDeliveries, w.Handle, event{ID: "e", Body: "x"})
	rec, err := store.Get(context.Background(), dedup.Key{Scope: scope, EventID: "e"})
	require.NoError(t, err)
	f := attemptFigures{starts: int(starts.Load()), letters: len(sink.Letters()), attempts: rec.Attempts,
		errs: errs, outcomes: outcomes}
	t.Log(f)
	require.Equal(t, 3, f.starts)
	require.Equal(t, 3, f.attempts)
	require.Zero(t, f.letters)
	require.Zero(t, errs, "Handle errors")
	require.Equal(t, dedup.StatusSucceeded, rec.Status)
	require.Equal(t, 1, countRows(t, pool, ledger, "e"))
	require.Equal(t, 1, outcomes[dedup.OutcomeProcessed])
}

// TestStaleWorkerWritesNoDeadLetter: worker A claims an event and stops
// extending its lease; after the lease, 20 deliveries race on worker B and
// one completes the event; then A's handler returns a permanent error. A must
// learn that it lost the event before writing anything: no dead letter for an
// event that succeeded. Only A's lease is short, since its lapsing is the
// point (A's store stalls, so nothing extends it); B's is long, so that B's
// racing deliveries hold the event however slowly a loaded machine runs them.
func TestStaleWorkerWritesNoDeadLetter(t *testing.T) {
	const lease = 300 * time.Millisecond
	for name, newStore := range concurrencyBackends() {
		for _, batch := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/batch=%v", name, batch), func(t *testing.T) {
				real := newStore(t)
				stale := deduptest.NewStallingStore(real)
				sink := dedup.NewMemorySink()
				scope := uniqueScope(t)
				opts := []dedup.Opt{dedup.WithScope(scope), dedup.WithSink(sink), dedup.WithLease(lease)}
				var starts atomic.Int32
				aStarted, release := make(chan struct{}), make(chan struct{})
				a, err := dedup.Wrap(stale, events, func(ctx context.Context, e event) error {
					if e.ID != "e" {
						return nil
					}
					starts.Add(1)
					stale.Stall()
					close(aStarted)
					<-release
					stale.Resume() // A wakes up
					return dedup.Permanent(errors.New("rejected by a rule B's run did not hit"))
				}, opts...)
				require.NoError(t, err)
				b, err := dedup.Wrap(real, events, func(ctx context.Context, e event) error {
					starts.Add(1)
					return nil
				}, append(opts, dedup.WithLease(time.Minute))...)
				require.NoError(t, err)

				msg := event{ID: "e", Body: "x"}
				var aErr error
				var aRes dedup.Result
				done := make(chan struct{})
				go func() {
					defer close(done)
					if !batch {
						aRes, aErr = a.Handle(context.Background(), msg)
						return
					}
					err := a.HandleBatch(context.Background(), []event{msg, {ID: "other", Body: "y"}},
						func(i int, res dedup.Result, err error) bool {
							if i == 0 {
								aRes, aErr = res, err
							}
							return true
						})
					require.NoError(t, err)
				}()
				<-aStarted
				time.Sleep(lease + 50*time.Millisecond)
				outcomes, errs := raceDeliveries(t, concurrentDeliveries, b.Handle, msg)
				close(release)
				<-done

				rec, err := real.Get(context.Background(), dedup.Key{Scope: scope, EventID: "e"})
				require.NoError(t, err)
				letters := 0
				for _, l := range sink.Letters() {
					if l.EventID == "e" {
						letters++
					}
				}
				t.Logf("stale worker: dead letters %d, record %s after %d attempts, handler starts %d, A: %v %v, B outcomes %v",
					letters, rec.Status, rec.Attempts, starts.Load(), aRes.Outcome, aErr, outcomes)
				require.Zero(t, errs)
				require.Equal(t, 1, outcomes[dedup.OutcomeProcessed])
				require.Equal(t, dedup.StatusSucceeded, rec.Status)
				require.Zero(t, letters, "no dead letter for an event that succeeded")
				require.ErrorIs(t, aErr, dedup.ErrLeaseLost)
				require.False(t, aRes.Settled())
				require.EqualValues(t, 2, starts.Load())
				require.Equal(t, 2, rec.Attempts)
			})
		}
	}
}

// raceBatches runs n HandleBatch calls at once, each over msgs and then
// over its unsettled messages again until all settle.
func raceBatches(t *testing.T, n int, w *dedup.Wrapper[event], msgs []event) (map[dedup.Outcome]int, int) {
	t.Helper()
	var mu sync.Mutex
	outcomes := map[dedup.Outcome]int{}
	errs := 0
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			<-start
			todo := msgs
			for range 200 {
				var again []event
				wait := time.Duration(0)
				err := w.HandleBatch(context.Background(), todo, func(i int, res dedup.Result, err error) bool {
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err != nil:
						errs++
						t.Logf("HandleBatch: %v", err)
						again = append(again, todo[i])
					case res.Settled():
						outcomes[res.Outcome]++
					default:
						again = append(again, todo[i])
						wait = max(wait, res.RetryAfter)
					}
					return true
				})
				if err != nil {
					t.Error(err)
					return
				}
				if len(again) == 0 {
					return
				}
				todo = again
				time.Sleep(max(wait, 10*time.Millisecond))
			}
			t.Error("a batch never settled")
		})
	}
	close(start)
	wg.Wait()
	return outcomes, errs
}

// TestConcurrentBatches races 20 batches that each hold a failing event
// twice (a producer retry in one fetch) beside an event of their own: the
// failing event starts at most MaxAttempts times and is parked once; with
// batch completion, an event held twice by every batch runs once.
func TestConcurrentBatches(t *testing.T) {
	const maxAttempts = 3
	for name, newStore := range concurrencyBackends() {
		t.Run(name+"/failing", func(t *testing.T) {
			store, sink := newStore(t), dedup.NewMemorySink()
			var starts atomic.Int32
			scope := uniqueScope(t)
			w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
				if e.ID != "poison" {
					return nil
				}
				starts.Add(1)
				time.Sleep(2 * time.Millisecond)
				return errors.New("downstream refused")
			}, dedup.WithScope(scope), dedup.WithSink(sink), dedup.WithMaxAttempts(maxAttempts),
				dedup.WithBackoff(dedup.ExponentialBackoff(time.Millisecond, 5*time.Millisecond)))
			require.NoError(t, err)
			outcomes, errs := raceBatches(t, concurrentDeliveries, w, []event{
				{ID: "poison", Body: "x"}, {ID: "other", Body: "y"}, {ID: "poison", Body: "x"},
			})
			rec, err := store.Get(context.Background(), dedup.Key{Scope: scope, EventID: "poison"})
			require.NoError(t, err)
			f := attemptFigures{starts: int(starts.Load()), letters: len(sink.Letters()), attempts: rec.Attempts,
				errs: errs, outcomes: outcomes}
			t.Log(f)
			require.LessOrEqual(t, f.starts, maxAttempts)
			require.Equal(t, 1, f.letters)
			require.Equal(t, f.starts, f.attempts)
			require.Zero(t, errs)
			require.Equal(t, 1, outcomes[dedup.OutcomeDeadLettered])
			require.Equal(t, 1, outcomes[dedup.OutcomeProcessed])
		})
		t.Run(name+"/batch-completion", func(t *testing.T) {
			store := newStore(t)
			if _, ok := store.(deduptype.BatchCompleter); !ok {
				t.Skip("no batch completion")
			}
			var starts atomic.Int32
			scope := uniqueScope(t)
			w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
				if e.ID == "e" {
					starts.Add(1)
				}
				return nil
			}, dedup.WithScope(scope), dedup.WithSink(dedup.NewMemorySink()), dedup.WithBatchCompletion(5*time.Millisecond))
			require.NoError(t, err)
			outcomes, errs := raceBatches(t, concurrentDeliveries, w, []event{
				{ID: "e", Body: "x"}, {ID: "f", Body: "y"}, {ID: "e", Body: "x"},
			})
			rec, err := store.Get(context.Background(), dedup.Key{Scope: scope, EventID: "e"})
			require.NoError(t, err)
			t.Logf("handler starts %d, record %s after %d attempts, outcomes %v", starts.Load(), rec.Status, rec.Attempts, outcomes)
			require.EqualValues(t, 1, starts.Load())
			require.Equal(t, 1, rec.Attempts)
			require.Equal(t, dedup.StatusSucceeded, rec.Status)
			require.Zero(t, errs)
			require.Equal(t, 2, outcomes[dedup.OutcomeProcessed], "e and f once each")
		})
	}
	t.Run("postgres-inbox/failing", func(t *testing.T) {
		pool := testenv.Postgres(t)
		store, sink := newPostgresStore(t, pool), dedup.NewMemorySink()
		var starts atomic.Int32
		scope := uniqueScope(t)
		w, err := dedup.WrapTx(store, events, func(ctx context.Context, tx pgx.Tx, e event) error {
			if e.ID != "poison" {
				return nil
			}
			starts.Add(1)
			time.Sleep(2 * time.Millisecond)
			return errors.New("downstream refused")
		}, dedup.WithScope(scope), dedup.WithSink(sink), dedup.WithMaxAttempts(maxAttempts),
			dedup.WithBackoff(dedup.ExponentialBackoff(time.Millisecond, 5*time.Millisecond)))
		require.NoError(t, err)
		outcomes, errs := raceBatches(t, concurrentDeliveries, w, []event{
			{ID: "poison", Body: "x"}, {ID: "other", Body: "y"}, {ID: "poison", Body: "x"},
		})
		rec, err := store.Get(context.Background(), dedup.Key{Scope: scope, EventID: "poison"})
		require.NoError(t, err)
		f := attemptFigures{starts: int(starts.Load()), letters: len(sink.Letters()), attempts: rec.Attempts,
			errs: errs, outcomes: outcomes}
		t.Log(f)
		require.LessOrEqual(t, f.starts, maxAttempts)
		require.Equal(t, 1, f.letters)
		require.Equal(t, f.starts, f.attempts)
		require.Zero(t, errs)
	})
}
