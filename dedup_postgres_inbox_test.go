package dedup_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptest"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/testenv"
)

// newLedger creates a business table for the inbox tests: one row per effect.
func newLedger(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	table := "inbox_ledger_" + deduptype.NewOwnerToken()[:12]
	_, err := pool.Exec(context.Background(), `CREATE TABLE `+table+` (event_id text NOT NULL, body text NOT NULL)`)
	require.NoError(t, err)
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP TABLE `+table) })
	return table
}

func countRows(t *testing.T, pool *pgxpool.Pool, table, id string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table+` WHERE event_id = $1`, id).Scan(&n))
	return n
}

// narrowInboxRow are the columns a committed inbox row sets, in order: its
// status (NULL, SUCCEEDED), attempts (NULL, 1), owner, lease and timestamps
// are NULL.
var narrowInboxRow = []string{"event_id", "expires_at", "fingerprint", "scope"}

// recordColumnsSet returns the names of the columns of key's row in the
// wrapper tests' record table that are not NULL, in order, and its packed
// fingerprint.
func recordColumnsSet(t *testing.T, pool *pgxpool.Pool, key dedup.Key) ([]string, []byte) {
	t.Helper()
	var set []string
	var fp []byte
	err := pool.QueryRow(context.Background(), `SELECT (SELECT array_agg(k ORDER BY k)
			FROM json_object_keys(json_strip_nulls(row_to_json(r))) k), fingerprint
		FROM dedup_wrapper_test r WHERE scope = $1 AND event_id = $2`, key.Scope, key.EventID).Scan(&set, &fp)
	require.NoError(t, err, key)
	return set, fp
}

// packedSHA256 is the default fingerprint of payload as the record table
// stores it: the SHA-256's 32 bytes (behind a 0x00 as hex digits when its
// hex starts with "00").
func packedSHA256(payload string) []byte {
	sum := sha256.Sum256([]byte(payload))
	if sum[0] == 0 {
		return append([]byte{0}, hex.EncodeToString(sum[:])...)
	}
	return sum[:]
}

func TestInbox(t *testing.T) {
	pool := testenv.Postgres(t)
	store := newPostgresStore(t, pool)
	ctx := context.Background()

	t.Run("ConcurrentDeliveriesOneRow", func(t *testing.T) {
		ledger := newLedger(t, pool)
		var runs atomic.Int32
		w, err := dedup.WrapTx(store, events, func(ctx context.Context, tx pgx.Tx, e event) error {
			runs.Add(1)
			_, err := tx.Exec(ctx, `INSERT INTO `+ledger+` VALUES ($1, $2)`, e.ID, e.Body)
			time.Sleep(5 * time.Millisecond) // hold the row lock while others queue on it
			return err
		}, fastOpts(t, dedup.NewMemorySink())...)
		require.NoError(t, err)

		start := make(chan struct{})
		var wg sync.WaitGroup
		outcomes := make(chan dedup.Outcome, 50)
		for i := 0; i < 50; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				res, err := w.Handle(ctx, event{ID: "pay-1", Body: "10 EUR"})
				if err != nil {
					t.Error(err)
					return
				}
				outcomes <- res.Outcome
			}()
		}
		close(start)
		wg.Wait()
		close(outcomes)
		counts := map[dedup.Outcome]int{}
		for o := range outcomes {
			counts[o]++
		}
		require.Equal(t, map[dedup.Outcome]int{dedup.OutcomeProcessed: 1, dedup.OutcomeDuplicate: 49}, counts)
		require.Equal(t, 1, countRows(t, pool, ledger, "pay-1"))
		require.EqualValues(t, 1, runs.Load(), "duplicates waited on the row instead of running")
		key := dedup.Key{Scope: w.Scope(), EventID: "pay-1"}
		set, fp := recordColumnsSet(t, pool, key)
		require.Equal(t, narrowInboxRow, set, "the committed inbox row is narrow")
		require.Equal(t, packedSHA256("10 EUR"), fp)
		rec, err := store.Get(ctx, key)
		require.NoError(t, err)
		require.Equal(t, dedup.StatusSucceeded, rec.Status)
		require.Equal(t, 1, rec.Attempts)
		require.Equal(t, "", rec.Owner)
	})

	t.Run("FailedAttemptRollsBackEffectAndIsCounted", func(t *testing.T) {
		ledger := newLedger(t, pool)
		var calls atomic.Int32
		w, err := dedup.WrapTx(store, events, func(ctx context.Context, tx pgx.Tx, e event) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+ledger+` VALUES ($1, $2)`, e.ID, e.Body); err != nil {
				return err
			}
			if calls.Add(1) <= 2 {
				return errors.New("downstream refused after our insert")
			}
			return nil
		}, fastOpts(t, dedup.NewMemorySink())...)
		require.NoError(t, err)

		res, err := w.Handle(ctx, event{ID: "e", Body: "x"})
		require.NoError(t, err)
		require.Equal(t, dedup.OutcomeRetry, res.Outcome)
		require.Equal(t, 0, countRows(t, pool, ledger, "e"), "the failed attempt's insert rolled back")
		rec, err := store.Get(ctx, res.Key)
		require.NoError(t, err)
		require.Equal(t, dedup.StatusFailedRetryable, rec.Status)
		require.Equal(t, 1, rec.Attempts)

		res = deliverUntilSettled(t, w, event{ID: "e", Body: "x"})
		require.Equal(t, dedup.OutcomeProcessed, res.Outcome)
		require.Equal(t, 3, res.Attempts)
		require.Equal(t, 1, countRows(t, pool, ledger, "e"))
		res, err = w.Handle(ctx, event{ID: "e", Body: "x"})
		require.NoError(t, err)
		require.Equal(t, dedup.OutcomeDuplicate, res.Outcome)
		require.Equal(t, 1, countRows(t, pool, ledger, "e"))
	})

	t.Run("PoisonIsDeadLetteredWithNoEffect", func(t *testing.T) {
		ledger := newLedger(t, pool)
		sink := dedup.NewMemorySink()
		w, err := dedup.WrapTx(store, events, func(ctx context.Context, tx pgx.Tx, e event) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+ledger+` VALUES ($1, $2)`, e.ID, e.Body); err != nil {
				return err
			}
			panic("bug")
		}, fastOpts(t, sink, dedup.WithMaxAttempts(3))...)
		require.NoError(t, err)
		res := deliverUntilSettled(t, w, event{ID: "poison", Body: "x"})
		require.Equal(t, dedup.OutcomeDeadLettered, res.Outcome)
		require.Equal(t, dedup.ReasonPanic, res.Reason)
		require.Equal(t, 0, countRows(t, pool, ledger, "poison"))
		require.Len(t, sink.Letters(), 1)
		require.Equal(t, 3, sink.Letters()[0].Attempts)
		rec, err := store.Get(ctx, res.Key)
		require.NoError(t, err)
		require.Equal(t, dedup.StatusFailedFinal, rec.Status)
		res, err = w.Handle(ctx, event{ID: "poison", Body: "x"})
		require.NoError(t, err)
		require.Equal(t, dedup.OutcomeDuplicate, res.Outcome)
	})

	t.Run("FailingSinkKeepsEventRetryable", func(t *testing.T) {
		sink := deduptest.NewFailingSink()
		w, err := dedup.WrapTx(store, events, func(ctx context.Context, tx pgx.Tx, e event) error {
			return dedup.Permanent(errors.New("unsupported"))
		}, fastOpts(t, sink)...)
		require.NoError(t, err)
		sink.FailWith(errors.New("dlq down"))
		res, err := w.Handle(ctx, event{ID: "s", Body: "x"})
		require.Error(t, err)
		require.False(t, res.Settled())
		sink.FailWith(nil)
		res = deliverUntilSettled(t, w, event{ID: "s", Body: "x"})
		require.Equal(t, dedup.OutcomeDeadLettered, res.Outcome)
		require.Len(t, sink.Letters(), 1)
	})

	t.Run("ConflictLeavesOriginalAlone", func(t *testing.T) {
		ledger := newLedger(t, pool)
		sink := dedup.NewMemorySink()
		w, err := dedup.WrapTx(store, events, func(ctx context.Context, tx pgx.Tx, e event) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+ledger+` VALUES ($1, $2)`, e.ID, e.Body)
			return err
		}, fastOpts(t, sink)...)
		require.NoError(t, err)
		res, err := w.Handle(ctx, event{ID: "c", Body: "10"})
		require.NoError(t, err)
		require.Equal(t, dedup.OutcomeProcessed, res.Outcome)
		res, err = w.Handle(ctx, event{ID: "c", Body: "9999"})
		require.NoError(t, err)
		require.Equal(t, dedup.OutcomeConflict, res.Outcome)
		require.Equal(t, 1, countRows(t, pool, ledger, "c"))
		require.Equal(t, dedup.ReasonConflict, sink.Letters()[0].Reason)
	})

	t.Run("BatchRunsEachInItsOwnTransaction", func(t *testing.T) {
		w, ledger := ledgerInbox(t, store, pool)
		var got []dedup.Outcome
		err := w.HandleBatch(ctx, []event{{ID: "a", Body: "1"}, {ID: "a", Body: "1"}, {ID: "b", Body: "1"}},
			func(i int, res dedup.Result, err error) bool {
				require.NoError(t, err)
				got = append(got, res.Outcome)
				return true
			})
		require.NoError(t, err)
		require.Equal(t, []dedup.Outcome{dedup.OutcomeProcessed, dedup.OutcomeDuplicate, dedup.OutcomeProcessed}, got)
		require.Equal(t, 1, countRows(t, pool, ledger, "a"))
	})
}

// A TxHandler that commits the transaction itself breaks the inbox's
// contract: Handle says so instead of a bare "tx is closed", and Health
// does not take it for an outage of the store.
func TestInboxHandlerMustNotCommit(t *testing.T) {
	pool := testenv.Postgres(t)
	store := newPostgresStore(t, pool)
	ledger := newLedger(t, pool)
	w, err := dedup.WrapTx(store, events, func(ctx context.Context, tx pgx.Tx, e event) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+ledger+` VALUES ($1, $2)`, e.ID, e.Body); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}, fastOpts(t, dedup.NewMemorySink(), dedup.WithOutageThreshold(time.Nanosecond))...)
	require.NoError(t, err)
	res, err := w.Handle(context.Background(), event{ID: "c", Body: "x"})
	require.ErrorIs(t, err, pgx.ErrTxClosed)
	require.ErrorContains(t, err, "TxHandler committed or rolled back the transaction itself; it must do neither")
	require.False(t, res.Settled(), "an error is never acknowledged")
	require.NoError(t, w.Health(), "the handler's fault is no outage")
	require.Equal(t, 1, countRows(t, pool, ledger, "c"), "the handler's own commit took its write and the record")
	res, err = w.Handle(context.Background(), event{ID: "c", Body: "x"})
	require.NoError(t, err)
	require.Equal(t, dedup.OutcomeDuplicate, res.Outcome, "the redelivery finds the record the handler committed")
}

func TestWrapTxRejectsNil(t *testing.T) {
	_, err := dedup.WrapTx[event](nil, events, func(context.Context, pgx.Tx, event) error { return nil },
		dedup.WithScope("s"), dedup.WithSink(dedup.NewMemorySink()))
	require.ErrorIs(t, err, dedup.ErrConfig)
}

// WrapTx records each event in its handler's transaction: batch completion
// is an option it cannot honour, refused rather than ignored.
func TestWrapTxRejectsBatchCompletion(t *testing.T) {
	store := newPostgresStore(t, testenv.Postgres(t))
	_, err := dedup.WrapTx(store, events, func(context.Context, pgx.Tx, event) error { return nil },
		dedup.WithScope("s"), dedup.WithSink(dedup.NewMemorySink()), dedup.WithBatchCompletion(time.Second))
	require.ErrorIs(t, err, dedup.ErrConfig)
	require.ErrorContains(t, err, "WithBatchCompletion")
}

// A TxHandler that returns nil after a statement of its transaction failed
// has failed: its writes cannot commit. Handle retries it with its attempts
// counted, then dead-letters it, as HandleBatch does; a handler's fault is
// no outage of the store.
func TestInboxNilAfterFailedStatementIsAFailure(t *testing.T) {
	pool := testenv.Postgres(t)
	store := newPostgresStore(t, pool)
	ledger := newLedger(t, pool)
	sink := dedup.NewMemorySink()
	logs := &logRecords{}
	w, err := dedup.WrapTx(store, events, func(ctx context.Context, tx pgx.Tx, e event) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+ledger+` VALUES ($1, $2)`, e.ID, e.Body); err != nil {
			return err
		}
		_, _ = tx.Exec(ctx, `SELECT 1/0`) // its error ignored
		return nil
	}, fastOpts(t, sink, dedup.WithMaxAttempts(3), dedup.WithLogger(slog.New(logs)),
		dedup.WithOutageThreshold(time.Nanosecond))...)
	require.NoError(t, err)
	ctx := context.Background()
	msg := event{ID: "ignored", Body: "x"}

	for attempt := 1; attempt <= 2; attempt++ {
		res, err := w.Handle(ctx, msg)
		require.NoError(t, err)
		require.Equal(t, dedup.OutcomeRetry, res.Outcome)
		require.ErrorIs(t, res.Err, dedup.ErrTxAborted)
		require.Equal(t, attempt, res.Attempts)
		rec, err := store.Get(ctx, res.Key)
		require.NoError(t, err)
		require.Equal(t, dedup.StatusFailedRetryable, rec.Status)
		require.Equal(t, attempt, rec.Attempts, "the attempt is counted")
	}
	res, err := w.Handle(ctx, msg)
	require.NoError(t, err)
	require.Equal(t, dedup.OutcomeDeadLettered, res.Outcome)
	require.Len(t, sink.Letters(), 1)
	require.Equal(t, 3, sink.Letters()[0].Attempts)
	require.Equal(t, 0, countRows(t, pool, ledger, msg.ID), "no write of an aborted transaction committed")
	require.NoError(t, w.Health(), "a handler's fault is no outage")
	for _, m := range logs.at(slog.LevelWarn) {
		require.NotContains(t, m, "outcome not recorded", "the failure is recorded on its first try")
	}
}

// A failure is recorded in the attempt's own transaction on its first try,
// even when a failed statement aborted it: the rollback to the claim is
// sent alone, not prepared in a batch the aborted transaction refuses.
func TestInboxFailureAfterFailedStatementRecordedFirstTry(t *testing.T) {
	pool := testenv.Postgres(t)
	store := newPostgresStore(t, pool)
	ledger := newLedger(t, pool)
	logs := &logRecords{}
	w, err := dedup.WrapTx(store, events, func(ctx context.Context, tx pgx.Tx, e event) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+ledger+` VALUES ($1, $2)`, e.ID, e.Body); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT 1/0`)
		return err
	}, fastOpts(t, dedup.NewMemorySink(), dedup.WithLogger(slog.New(logs)), dedup.WithOutageThreshold(time.Nanosecond))...)
	require.NoError(t, err)
	res, err := w.Handle(context.Background(), event{ID: "div", Body: "x"})
	require.NoError(t, err)
	require.Equal(t, dedup.OutcomeRetry, res.Outcome)
	require.Equal(t, 1, res.Attempts)
	rec, err := store.Get(context.Background(), res.Key)
	require.NoError(t, err)
	require.Equal(t, dedup.StatusFailedRetryable, rec.Status)
	require.Equal(t, 1, rec.Attempts)
	require.Contains(t, rec.LastError, "division by zero")
	require.Equal(t, 0, countRows(t, pool, ledger, "div"))
	require.Empty(t, logs.at(slog.LevelWarn), "no settling write failed")
	require.NoError(t, w.Health())
}
