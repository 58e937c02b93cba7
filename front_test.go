package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/testenv"
)

// work is the message of the test fronts: the work itself, run by runWork.
type work = func(ctx context.Context) error

func runWork(ctx context.Context, w work) error { return w(ctx) }

func newFront(t *testing.T, store dedup.Store, opts ...dedup.Opt) *dedup.Front[work] {
	t.Helper()
	f, err := dedup.NewFront(store, runWork, opts...)
	require.NoError(t, err)
	return f
}

// frontKey is a key of its own for t.
func frontKey(t *testing.T, id string) dedup.Key {
	return dedup.Key{Scope: uniqueScope(t), EventID: id}
}

// acquire claims key on f and returns its attempt.
func acquire[M any](t *testing.T, f *dedup.Front[M], key dedup.Key) *dedup.Attempt[M] {
	t.Helper()
	c, att, err := f.Claim(context.Background(), key, "f")
	require.NoError(t, err)
	require.Equal(t, dedup.ClaimAcquired, c.Status)
	require.NotNil(t, att)
	t.Cleanup(func() { att.End(context.Background()) })
	return att
}

// lostLeaseStore refuses every lease extension, as when another worker took
// the key over, and loses the answer of the first completion it applies.
type lostLeaseStore struct {
	dedup.Store
	completes atomic.Int32
}

func (s *lostLeaseStore) Extend(_ context.Context, key dedup.Key, _ string, _ time.Duration) error {
	return fmt.Errorf("front test: extend %s: %w", key, dedup.ErrLeaseLost)
}

func (s *lostLeaseStore) Complete(ctx context.Context, key dedup.Key, owner string, result []byte, ttl time.Duration) error {
	err := s.Store.Complete(ctx, key, owner, result, ttl)
	if s.completes.Add(1) == 1 && err == nil {
		return errors.New("front test: connection reset after the write")
	}
	return err
}

// An attempt whose lease is lost has its work cancelled with ErrLeaseLost
// as the cause; a completion whose first answer was lost, then refused,
// counts as written because it landed, and a later claim finds its result;
// a panic comes back as a *PanicError; a claim that is not acquired comes
// without an attempt.
func TestFrontAttemptHoldsItsClaim(t *testing.T) {
	store := &lostLeaseStore{Store: dedup.NewMemoryStore()}
	f := newFront(t, store, dedup.WithLease(300*time.Millisecond))
	key := frontKey(t, "op")
	att := acquire(t, f, key)
	err := att.Run(context.Background(), func(ctx context.Context) error {
		<-ctx.Done() // the first extension, at a third of the lease, is refused
		return context.Cause(ctx)
	})
	require.ErrorIs(t, err, dedup.ErrLeaseLost)

	require.NoError(t, att.Complete(context.Background(), []byte("answer")))
	require.EqualValues(t, 2, store.completes.Load(), "tried again after the lost answer")
	c, again, err := f.Claim(context.Background(), key, "f")
	require.NoError(t, err)
	require.Nil(t, again)
	require.Equal(t, dedup.ClaimDuplicate, c.Status)
	require.Equal(t, []byte("answer"), c.Record.Result)
	c, again, err = f.Claim(context.Background(), key, "another fingerprint")
	require.NoError(t, err)
	require.Nil(t, again)
	require.Equal(t, dedup.ClaimConflict, c.Status)

	err = acquire(t, f, frontKey(t, "panics")).Run(context.Background(), func(context.Context) error { panic("boom") })
	var perr *dedup.PanicError
	require.ErrorAs(t, err, &perr)
	require.Equal(t, "boom", perr.Value)
}

// A front end's caller leaving (its context cancelled) cancels the work's
// context, but ends neither the claim's heartbeat, which holds the key
// while the work goes on, nor the settling write.
func TestFrontAttemptOutlivesItsCaller(t *testing.T) {
	store := dedup.NewMemoryStore()
	const lease = 600 * time.Millisecond
	f := newFront(t, store, dedup.WithLease(lease))
	key := frontKey(t, "op")
	att := acquire(t, f, key)
	ctx, leave := context.WithCancel(context.Background())
	var retry dedup.Claim
	err := att.Run(ctx, func(wctx context.Context) error {
		leave()
		<-wctx.Done()
		time.Sleep(3 * lease) // the work goes on, past the lease it started with
		var err error
		retry, _, err = f.Claim(context.Background(), key, "f")
		return err
	})
	require.NoError(t, err)
	require.Equal(t, dedup.ClaimInFlight, retry.Status, "the heartbeat held the key")
	require.NoError(t, att.Complete(ctx, []byte("done")), "the settling write outlives the caller")
	rec, err := store.Get(context.Background(), key)
	require.NoError(t, err)
	require.Equal(t, dedup.StatusSucceeded, rec.Status)
}

// blipStore fails its first fails completions and every claim while down,
// as a store briefly unreachable.
type blipStore struct {
	dedup.Store
	fails     int32
	completes atomic.Int32
	down      atomic.Bool
}

func (s *blipStore) Complete(ctx context.Context, key dedup.Key, owner string, result []byte, ttl time.Duration) error {
	if s.completes.Add(1) <= s.fails || s.down.Load() {
		return errors.New("front test: store unreachable")
	}
	return s.Store.Complete(ctx, key, owner, result, ttl)
}

func (s *blipStore) Claim(ctx context.Context, req dedup.ClaimRequest) (dedup.Claim, error) {
	if s.down.Load() {
		return dedup.Claim{}, errors.New("front test: store unreachable")
	}
	return s.Store.Claim(ctx, req)
}

// A completion that fails for longer than a lease is tried again, as a
// Wrapper's is, for up to ten leases, and recorded.
func TestFrontAttemptCompletionOutlastsALease(t *testing.T) {
	store := &blipStore{Store: dedup.NewMemoryStore(), fails: 4}
	const lease = 200 * time.Millisecond
	f := newFront(t, store, dedup.WithLease(lease))
	key := frontKey(t, "op")
	att := acquire(t, f, key)
	require.NoError(t, att.Run(context.Background(), func(context.Context) error { return nil }))
	start := time.Now()
	require.NoError(t, att.Complete(context.Background(), []byte("answer")))
	// The waits between the tries alone (50, 100, 200 and 400 ms) outlast
	// the lease: a completion tried for one lease would have given up.
	require.Greater(t, time.Since(start), lease)
	require.EqualValues(t, 5, store.completes.Load())
	rec, err := store.Get(context.Background(), key)
	require.NoError(t, err)
	require.Equal(t, dedup.StatusSucceeded, rec.Status)
	require.Equal(t, []byte("answer"), rec.Result)
	require.NoError(t, f.Health())
}

// The failures of a front's claims and settling writes feed its outage
// tracker; a write that succeeds ends the outage.
func TestFrontAttemptOutageReported(t *testing.T) {
	store := &blipStore{Store: dedup.NewMemoryStore()}
	f := newFront(t, store, dedup.WithLease(50*time.Millisecond), dedup.WithOutageThreshold(time.Millisecond))
	att := acquire(t, f, frontKey(t, "op"))
	require.NoError(t, att.Run(context.Background(), func(context.Context) error { return nil }))
	store.down.Store(true)
	// Tried again for ten leases, every try failing.
	require.Error(t, att.Complete(context.Background(), []byte("answer")))
	require.ErrorIs(t, f.Health(), dedup.ErrOutage)
	_, none, err := f.Claim(context.Background(), frontKey(t, "other"), "f")
	require.Error(t, err)
	require.Nil(t, none)
	require.ErrorIs(t, f.Health(), dedup.ErrOutage)

	store.down.Store(false)
	att = acquire(t, f, frontKey(t, "after"))
	require.NoError(t, att.Run(context.Background(), func(context.Context) error { return nil }))
	require.NoError(t, att.Complete(context.Background(), []byte("answer")))
	require.NoError(t, f.Health())
}

// txWork is the message of the transactional test fronts.
type txWork = func(ctx context.Context, tx pgx.Tx) error

// beginCounter is a TxBeginner counting the transactions it begins.
type beginCounter struct {
	dedup.TxBeginner
	n atomic.Int32
}

func (b *beginCounter) Begin(ctx context.Context) (pgx.Tx, error) {
	b.n.Add(1)
	return b.TxBeginner.Begin(ctx)
}

// A transactional front's attempt is the inbox's, begun on the database
// it was given: a completion writes its result on the record in the
// attempt's transaction and commits it with the work's rows; after a
// failed statement, a completion is the work's failure (ErrTxAborted),
// recorded as one with its rows rolled back, and a refusal is recorded
// alone, the rows rolled back to the claim; a failure rolls the rows back
// and leaves the key to be taken over. A failed statement is no outage.
func TestTxFrontAttempt(t *testing.T) {
	pool := testenv.Postgres(t)
	store := newPostgresStore(t, pool)
	ledger := newLedger(t, pool)
	db := &beginCounter{TxBeginner: pool}
	f, err := dedup.NewTxFront(store, db, func(ctx context.Context, tx pgx.Tx, w txWork) error { return w(ctx, tx) },
		dedup.WithOutageThreshold(time.Nanosecond))
	require.NoError(t, err)
	ctx := context.Background()
	insert := func(id string, failing bool) txWork {
		return func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+ledger+` VALUES ($1, 'row')`, id); err != nil {
				return err
			}
			if failing {
				_, err := tx.Exec(ctx, `INSERT INTO `+ledger+` VALUES ($1, NULL)`, id)
				require.Error(t, err)
			}
			return nil
		}
	}
	record := func(key dedup.Key) dedup.Record {
		rec, err := store.Get(ctx, key)
		require.NoError(t, err)
		return rec
	}

	key := frontKey(t, "completed")
	att := acquire(t, f, key)
	require.NoError(t, att.Run(ctx, insert(key.EventID, false)))
	require.NoError(t, att.Complete(ctx, []byte("created")))
	require.Equal(t, 1, countRows(t, pool, ledger, key.EventID))
	require.Equal(t, []byte("created"), record(key).Result)
	require.EqualValues(t, 1, db.n.Load(), "begun on the database given")

	key = frontKey(t, "refused")
	att = acquire(t, f, key)
	require.NoError(t, att.Run(ctx, insert(key.EventID, true)))
	require.NoError(t, att.Refuse(ctx, []byte("refused")))
	require.Equal(t, 0, countRows(t, pool, ledger, key.EventID))
	rec := record(key)
	require.Equal(t, dedup.StatusSucceeded, rec.Status)
	require.Equal(t, []byte("refused"), rec.Result)

	key = frontKey(t, "aborted")
	att = acquire(t, f, key)
	require.NoError(t, att.Run(ctx, insert(key.EventID, true)))
	err = att.Complete(ctx, []byte("created"))
	require.ErrorIs(t, err, dedup.ErrTxAborted)
	require.Equal(t, 0, countRows(t, pool, ledger, key.EventID))
	rec = record(key)
	require.Equal(t, dedup.StatusFailedRetryable, rec.Status, "the failure is recorded")
	require.Equal(t, 1, rec.Attempts)
	require.Contains(t, rec.LastError, dedup.ErrTxAborted.Error())
	require.NoError(t, f.Health(), "the work's fault is no outage")

	key = frontKey(t, "failed")
	att = acquire(t, f, key)
	require.NoError(t, att.Run(ctx, insert(key.EventID, true)))
	require.NoError(t, att.Fail(ctx, errors.New("status 503")))
	require.Equal(t, 0, countRows(t, pool, ledger, key.EventID))
	rec = record(key)
	require.Equal(t, dedup.StatusFailedRetryable, rec.Status)
	require.Equal(t, "status 503", rec.LastError)
	att = acquire(t, f, key)
	require.NoError(t, att.Run(ctx, insert(key.EventID, false)))
	require.NoError(t, att.Complete(ctx, []byte("created")))
	require.Equal(t, 1, countRows(t, pool, ledger, key.EventID))
	require.Equal(t, 2, record(key).Attempts)
	require.NoError(t, f.Health())
}

// An option that only a consumer honours is refused by NewFront and
// NewTxFront with an error that names it, rather than ignored (or, for
// WithBatchCompletion on a store that cannot complete a batch, refused for
// another reason).
func TestFrontRefusesConsumerOptions(t *testing.T) {
	store := newPostgresStore(t, testenv.Postgres(t))
	consumerOnly := map[string]dedup.Opt{
		"WithScope":           dedup.WithScope("s"),
		"WithSink":            dedup.WithSink(dedup.NewMemorySink()),
		"WithMaxAttempts":     dedup.WithMaxAttempts(3),
		"WithObserver":        dedup.WithObserver(func(context.Context, dedup.Result) {}),
		"WithBatchCompletion": dedup.WithBatchCompletion(time.Second),
		"WithFingerprint":     dedup.WithFingerprint(dedup.SHA256Fingerprint()),
		"WithBackoff":         dedup.WithBackoff(dedup.ExponentialBackoff(time.Millisecond, time.Second)),
		"WithTxPerEvent":      dedup.WithTxPerEvent(),
	}
	noBatches := struct{ dedup.Store }{dedup.NewMemoryStore()} // no BatchCompleter
	for name, opt := range consumerOnly {
		t.Run(name, func(t *testing.T) {
			_, err := dedup.NewFront(noBatches, runWork, dedup.WithLease(time.Second), opt)
			require.ErrorIs(t, err, dedup.ErrConfig)
			require.ErrorContains(t, err, name)
			require.Regexp(t, `only (Wrap and )?WrapTx do`, err.Error())
			_, err = dedup.NewTxFront(store, testenv.Postgres(t), func(context.Context, pgx.Tx, txWork) error { return nil }, opt)
			require.ErrorIs(t, err, dedup.ErrConfig)
			require.ErrorContains(t, err, name)
		})
	}
	_, err := dedup.NewFront(noBatches, runWork, dedup.WithLease(time.Second), dedup.WithTTL(time.Hour),
		dedup.WithLogger(slog.Default()), dedup.WithOutageThreshold(time.Second))
	require.NoError(t, err, "the options a front honours")
}
