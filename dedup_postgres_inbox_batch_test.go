package dedup_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/testenv"
)

// commitCounter counts the transactions committed through a pool.
type commitCounter struct{ commits atomic.Int32 }

func (c *commitCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.EqualFold(strings.TrimSpace(data.SQL), "commit") {
		c.commits.Add(1)
	}
	return ctx
}

func (c *commitCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// countedStore returns a store on a pool of its own whose commits are
// counted.
func countedStore(t *testing.T) (*dedup.PostgresStore, *pgxpool.Pool, *commitCounter) {
	t.Helper()
	cfg := testenv.Postgres(t).Config()
	counter := &commitCounter{}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return newPostgresStore(t, pool), pool, counter
}

// ledgerInbox returns a WrapTx wrapper whose handler writes each event's
// effect as a row of a ledger of its own, and that ledger.
func ledgerInbox(t *testing.T, store *dedup.PostgresStore, pool *pgxpool.Pool) (*dedup.Wrapper[event], string) {
	t.Helper()
	ledger := newLedger(t, pool)
	w, err := dedup.WrapTx(store, events, func(ctx context.Context, tx pgx.Tx, e event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+ledger+` VALUES ($1, $2)`, e.ID, e.Body)
		return err
	}, fastOpts(t, dedup.NewMemorySink())...)
	require.NoError(t, err)
	return w, ledger
}

func batchOf(prefix string, n int) []event {
	batch := make([]event, n)
	for i := range batch {
		batch[i] = event{ID: prefix + strconv.Itoa(i), Body: "b"}
	}
	return batch
}

// handleInbox runs batch through w and returns the outcomes given, failing
// on an error.
func handleInbox(t *testing.T, w *dedup.Wrapper[event], batch []event) []dedup.Outcome {
	t.Helper()
	var outcomes []dedup.Outcome
	require.NoError(t, w.HandleBatch(context.Background(), batch, func(i int, res dedup.Result, err error) bool {
		require.NoError(t, err)
		require.Len(t, outcomes, i, "in order")
		outcomes = append(outcomes, res.Outcome)
		return true
	}))
	return outcomes
}

// A batch of the transactional inbox runs in one transaction per 1,024
// events: 1,100 events, two commits, every effect and record there once.
func TestInboxBatchSharesATransaction(t *testing.T) {
	store, pool, counter := countedStore(t)
	w, ledger := ledgerInbox(t, store, pool)
	batch := batchOf("b-", 1100)
	batch = append(batch, batch[7]) // a redelivery within the batch
	counter.commits.Store(0)
	outcomes := handleInbox(t, w, batch)
	require.Len(t, outcomes, 1101)
	for i, o := range outcomes[:1100] {
		require.Equal(t, dedup.OutcomeProcessed, o, "event %d", i)
	}
	require.Equal(t, dedup.OutcomeDuplicate, outcomes[1100])
	require.EqualValues(t, 2, counter.commits.Load(), "one commit per 1,024 events")
	var effects int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+ledger).Scan(&effects))
	require.Equal(t, 1100, effects)
	// Every record is the inbox's narrow row.
	var rows, narrow int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE
			(SELECT array_agg(k ORDER BY k) FROM json_object_keys(json_strip_nulls(row_to_json(r))) k) = $2
			AND fingerprint = $3)
		FROM dedup_wrapper_test r WHERE scope = $1`, w.Scope(), narrowInboxRow, packedSHA256("b")).Scan(&rows, &narrow))
	require.Equal(t, 1100, rows)
	require.Equal(t, 1100, narrow, "records with only the key, fingerprint and expiry set")

	// Delivered again: duplicates, nothing written.
	for _, o := range handleInbox(t, w, batch) {
		require.Equal(t, dedup.OutcomeDuplicate, o)
	}
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+ledger).Scan(&effects))
	require.Equal(t, 1100, effects)
}

// A handler that fails (before writing, after an Exec or a QueryRow),
// panics, swallows a failed statement or tries to end the shared
// transaction loses its own writes and has its attempt counted, its handler
// run once; the events around it commit (those before it run again when it
// wrote), and a redelivery runs only the failed ones.
func TestInboxBatchFailureStaysAlone(t *testing.T) {
	store, pool, _ := countedStore(t)
	ledger := newLedger(t, pool)
	var mu sync.Mutex
	ran := map[string]int{}
	fixed := atomic.Bool{}
	w, err := dedup.WrapTx(store, events, func(ctx context.Context, tx pgx.Tx, e event) error {
		mu.Lock()
		ran[e.ID]++
		mu.Unlock()
		if e.ID == "early" && !fixed.Load() {
			return errors.New("fails before writing") // nothing of its own to roll back
		}
		if e.ID == "row" {
			var id string
			if err := tx.QueryRow(ctx, `INSERT INTO `+ledger+` VALUES ($1, $2) RETURNING event_id`, e.ID, e.Body).Scan(&id); err != nil {
				return err
			}
			if !fixed.Load() {
				return errors.New("fails after a QueryRow")
			}
			return nil
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+ledger+` VALUES ($1, $2)`, e.ID, e.Body); err != nil {
			return err
		}
		if fixed.Load() {
			return nil
		}
		switch e.ID {
		case "fails":
			return errors.New("card declined")
		case "panics":
			panic("corrupt state")
		case "swallows":
			_, _ = tx.Exec(ctx, `SELECT 1/0`) // the error is ignored, the transaction is aborted
			return nil
		case "commits":
			return tx.Commit(ctx)
		}
		return nil
	}, fastOpts(t, dedup.NewMemorySink())...)
	require.NoError(t, err)
	batch := []event{{ID: "ok-1", Body: "a"}, {ID: "fails", Body: "a"}, {ID: "ok-2", Body: "a"}, {ID: "panics", Body: "a"},
		{ID: "ok-3", Body: "a"}, {ID: "swallows", Body: "a"}, {ID: "ok-4", Body: "a"}, {ID: "commits", Body: "a"}, {ID: "ok-5", Body: "a"}, {ID: "early", Body: "a"},
		{ID: "ok-6", Body: "a"}, {ID: "row", Body: "a"}, {ID: "ok-7", Body: "a"}}
	outcomes := handleInbox(t, w, batch)
	for i, e := range batch {
		want, rows := dedup.OutcomeProcessed, 1
		if !strings.HasPrefix(e.ID, "ok-") {
			want, rows = dedup.OutcomeRetry, 0
		}
		require.Equal(t, want, outcomes[i], e.ID)
		require.Equal(t, rows, countRows(t, pool, ledger, e.ID), e.ID)
	}
	for _, id := range []string{"fails", "panics", "swallows", "commits", "early", "row"} {
		rec, err := store.Get(context.Background(), dedup.Key{Scope: w.Scope(), EventID: id})
		require.NoError(t, err, id)
		require.Equal(t, dedup.StatusFailedRetryable, rec.Status, id)
		require.Equal(t, 1, rec.Attempts, id)
	}

	fixed.Store(true)
	outcomes = handleInbox(t, w, batch)
	for i, e := range batch {
		want := dedup.OutcomeDuplicate
		if !strings.HasPrefix(e.ID, "ok-") {
			want = dedup.OutcomeProcessed
		}
		require.Equal(t, want, outcomes[i], e.ID)
		require.Equal(t, 1, countRows(t, pool, ledger, e.ID), e.ID)
	}
	for _, e := range batch {
		if strings.HasPrefix(e.ID, "ok-") {
			// Run again after a failure behind it rolled its first run back.
			require.LessOrEqual(t, ran[e.ID], 2, e.ID)
		} else {
			require.Equal(t, 2, ran[e.ID], e.ID+": failed once, not run again until redelivered")
		}
	}
}

// A transaction that cannot commit (a deferred constraint one handler
// violated) takes nothing with it: its events run again one transaction
// each, the guilty one fails alone and the others are processed once.
func TestInboxBatchCommitFailure(t *testing.T) {
	store, pool, _ := countedStore(t)
	ctx := context.Background()
	table := "inbox_unique_" + deduptype.NewOwnerToken()[:12]
	_, err := pool.Exec(ctx, `CREATE TABLE `+table+` (v text, CONSTRAINT `+table+`_v UNIQUE (v) DEFERRABLE INITIALLY DEFERRED)`)
	require.NoError(t, err)
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP TABLE `+table) })
	_, err = pool.Exec(ctx, `INSERT INTO `+table+` VALUES ('taken')`)
	require.NoError(t, err)
	var runs atomic.Int32
	w, err := dedup.WrapTx(store, events, func(ctx context.Context, tx pgx.Tx, e event) error {
		runs.Add(1)
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1)`, e.Body) // checked at commit
		return err
	}, fastOpts(t, dedup.NewMemorySink())...)
	require.NoError(t, err)
	batch := []event{{ID: "a", Body: "a"}, {ID: "guilty", Body: "taken"}, {ID: "c", Body: "c"}}
	var outcomes []dedup.Outcome
	var errs int
	require.NoError(t, w.HandleBatch(ctx, batch, func(i int, res dedup.Result, err error) bool {
		if err != nil {
			errs++
		}
		outcomes = append(outcomes, res.Outcome)
		return true
	}))
	require.Equal(t, dedup.OutcomeProcessed, outcomes[0])
	require.Equal(t, 1, errs, "the guilty event's own commit fails")
	require.Equal(t, dedup.OutcomeProcessed, outcomes[2])
	require.EqualValues(t, 6, runs.Load(), "three in the shared transaction, three again one by one")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n))
	require.Equal(t, 3, n, "taken, a and c")
	for _, o := range handleInbox(t, w, []event{batch[0], batch[2]}) {
		require.Equal(t, dedup.OutcomeDuplicate, o)
	}
}

// Fifty goroutines deliver overlapping batches of the same twenty events at
// once: each effect is written exactly once.
func TestInboxBatchConcurrentOverlap(t *testing.T) {
	store, pool, _ := countedStore(t)
	w, ledger := ledgerInbox(t, store, pool)
	all := batchOf("o-", 20)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 50 {
		wg.Go(func() {
			<-start
			batch := append(append([]event{}, all[g%20:]...), all[:g%20]...) // each starts elsewhere
			for len(batch) > 0 {
				next := 0
				err := w.HandleBatch(context.Background(), batch, func(i int, res dedup.Result, err error) bool {
					if err != nil || !res.Settled() {
						return false // a transport redelivers from here
					}
					next = i + 1
					return true
				})
				if err != nil {
					t.Error(err)
					return
				}
				batch = batch[next:]
			}
		})
	}
	close(start)
	wg.Wait()
	rows, err := pool.Query(context.Background(), `SELECT event_id, count(*) FROM `+ledger+` GROUP BY event_id`)
	require.NoError(t, err)
	counts := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		counts[id] = n
	}
	require.NoError(t, rows.Err())
	require.Len(t, counts, 20)
	for id, n := range counts {
		require.Equal(t, 1, n, id)
	}
}

// WithTxPerEvent keeps one transaction per event.
func TestInboxBatchTxPerEvent(t *testing.T) {
	store, _, counter := countedStore(t)
	w, err := dedup.WrapTx(store, events, func(context.Context, pgx.Tx, event) error { return nil },
		fastOpts(t, dedup.NewMemorySink(), dedup.WithTxPerEvent())...)
	require.NoError(t, err)
	counter.commits.Store(0)
	handleInbox(t, w, batchOf("p-", 5))
	require.EqualValues(t, 5, counter.commits.Load())
}

// A transport stops at the first result it cannot acknowledge: the results
// after it, committed in the same transaction, are not given to it (they
// come back as duplicates), so that it never acknowledges past the failure.
func TestInboxBatchStopsAtUnsettled(t *testing.T) {
	store, _, _ := countedStore(t)
	w, err := dedup.WrapTx(store, events, func(_ context.Context, _ pgx.Tx, e event) error {
		if e.ID == "fails" {
			return errors.New("not yet")
		}
		return nil
	}, fastOpts(t, dedup.NewMemorySink())...)
	require.NoError(t, err)
	batch := []event{{ID: "s-1", Body: "a"}, {ID: "fails", Body: "a"}, {ID: "s-2", Body: "a"}}
	var given []string
	require.NoError(t, w.HandleBatch(context.Background(), batch, func(i int, res dedup.Result, err error) bool {
		given = append(given, batch[i].ID)
		return err == nil && res.Settled()
	}))
	require.Equal(t, []string{"s-1", "fails"}, given)
	require.Equal(t, []dedup.Outcome{dedup.OutcomeRetry, dedup.OutcomeDuplicate}, handleInbox(t, w, batch[1:]))
}

// A poison event in a shared transaction is dead-lettered once, and only
// once that transaction committed: when the commit fails (here a deferred
// constraint another event violated), its letter is not sent twice, and its
// handler, whose verdict stands, does not run again.
func TestInboxBatchDeadLetterAfterCommit(t *testing.T) {
	store, pool, _ := countedStore(t)
	ctx := context.Background()
	table := "inbox_poison_" + deduptype.NewOwnerToken()[:12]
	_, err := pool.Exec(ctx, `CREATE TABLE `+table+` (v text, CONSTRAINT `+table+`_v UNIQUE (v) DEFERRABLE INITIALLY DEFERRED)`)
	require.NoError(t, err)
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP TABLE `+table) })
	_, err = pool.Exec(ctx, `INSERT INTO `+table+` VALUES ('taken')`)
	require.NoError(t, err)
	var mu sync.Mutex
	ran := map[string]int{}
	sink := dedup.NewMemorySink()
	w, err := dedup.WrapTx(store, events, func(ctx context.Context, tx pgx.Tx, e event) error {
		mu.Lock()
		ran[e.ID]++
		mu.Unlock()
		switch e.ID {
		case "poison":
			return dedup.Permanent(errors.New("malformed order"))
		case "writes-then-poison":
			if _, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1)`, e.ID); err != nil {
				return err
			}
			return dedup.Permanent(errors.New("malformed after writing"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1)`, e.Body) // checked at commit
		return err
	}, fastOpts(t, sink)...)
	require.NoError(t, err)

	batch := []event{{ID: "a", Body: "a"}, {ID: "poison", Body: "p"}, {ID: "writes-then-poison", Body: "w"},
		{ID: "guilty", Body: "taken"}, {ID: "c", Body: "c"}}
	var outcomes []dedup.Outcome
	require.NoError(t, w.HandleBatch(ctx, batch, func(i int, res dedup.Result, err error) bool {
		outcomes = append(outcomes, res.Outcome)
		return true
	}))
	require.Equal(t, []dedup.Outcome{dedup.OutcomeProcessed, dedup.OutcomeDeadLettered, dedup.OutcomeDeadLettered,
		0, dedup.OutcomeProcessed}, outcomes, "the guilty event's own commit fails")
	letters := sink.Letters()
	require.Len(t, letters, 2)
	for _, id := range []string{"poison", "writes-then-poison"} {
		require.Equal(t, 1, ran[id], id)
		rec, err := store.Get(ctx, dedup.Key{Scope: w.Scope(), EventID: id})
		require.NoError(t, err)
		require.Equal(t, dedup.StatusFailedFinal, rec.Status, id)
		require.Equal(t, 1, rec.Attempts, id)
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n))
	require.Equal(t, 3, n, "taken, a and c: the poison's write rolled back")
}
