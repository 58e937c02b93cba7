package dedup_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/idemhttp"
	"github.com/dedupkit/dedup/internal/testenv"
)

// noProgress is how long the tests below wait for the next step of work
// that is under way (a handler entering, an answer) before failing: a
// loaded machine can stall for seconds, a lost step for ever.
const noProgress = 60 * time.Second

// lazyPool returns a pool of maxConns connections that connects only when
// used, for the tests of what a store derives from its size.
func lazyPool(t *testing.T, maxConns int) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.DefaultPostgresDSN)
	require.NoError(t, err)
	cfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// postgresPoolOf returns a pool of maxConns connections to the tests'
// database, closed when t ends.
func postgresPoolOf(t *testing.T, maxConns int) *pgxpool.Pool {
	t.Helper()
	cfg := testenv.Postgres(t).Config()
	cfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func TestTxConnsOption(t *testing.T) {
	for maxConns, want := range map[int]int{1: 1, 2: 1, 4: 3, 8: 6, 20: 15, 40: 30} {
		s, err := dedup.NewPostgresStore(lazyPool(t, maxConns))
		require.NoError(t, err)
		require.Equal(t, want, s.TxConns(), "default bound on a pool of %d", maxConns)
	}
	pool := lazyPool(t, 8)
	s, err := dedup.NewPostgresStore(pool, dedup.WithTxConns(8))
	require.NoError(t, err)
	require.Equal(t, 8, s.TxConns())
	for _, n := range []int{0, -1, 9, 50} {
		_, err := dedup.NewPostgresStore(pool, dedup.WithTxConns(n))
		require.ErrorIs(t, err, dedup.ErrConfig, "WithTxConns(%d) on a pool of 8", n)
		require.ErrorContains(t, err, fmt.Sprintf("WithTxConns(%d)", n))
	}
	_, err = dedup.NewPostgresStore(pool, dedup.WithTxConns(50))
	require.ErrorContains(t, err, "the pool has 8 connections")
	require.ErrorContains(t, err, "raise MaxConns to 66")

	_, err = dedup.NewDynamoDBStore(dynamodb.New(dynamodb.Options{}), dedup.WithTxConns(3))
	require.ErrorIs(t, err, dedup.ErrConfig)
	require.ErrorContains(t, err, "WithTxConns")
}

func TestTxConnsWarnsWithoutReserve(t *testing.T) {
	const msg = "the transactional inbox may hold every connection of its pool"
	for _, tc := range []struct {
		name     string
		maxConns int
		opts     []dedup.StoreOpt
		want     []string // in the WARN, or none logged
	}{
		{"default", 8, nil, nil},
		{"below the pool", 8, []dedup.StoreOpt{dedup.WithTxConns(7)}, nil},
		{"the whole pool", 8, []dedup.StoreOpt{dedup.WithTxConns(8)}, []string{"tx_conns=8", "pool_max_conns=8",
			`fix="raise the pool's MaxConns (pool_max_conns) to 10, or bound the inbox with dedup.WithTxConns(6)"`}},
		{"a pool of one", 1, nil, []string{"tx_conns=1", "pool_max_conns=1",
			`fix="raise the pool's MaxConns (pool_max_conns) to 2"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := dedup.NewPostgresStore(lazyPool(t, tc.maxConns), tc.opts...)
			require.NoError(t, err)
			var b strings.Builder
			_, err = dedup.WrapTx(s, events, func(context.Context, pgx.Tx, event) error { return nil },
				dedup.WithScope("txconns/warn"), dedup.WithSink(dedup.NewMemorySink()),
				dedup.WithLogger(slog.New(slog.NewTextHandler(&b, nil))))
			require.NoError(t, err)
			logged := b.String()
			if tc.want == nil {
				require.NotContains(t, logged, msg)
				return
			}
			require.Equal(t, 1, strings.Count(logged, msg), logged)
			require.Contains(t, logged, "level=WARN")
			for _, want := range tc.want {
				require.Contains(t, logged, want)
			}
		})
	}
}

// TestTxConnsBacklogLeavesThePoolToTheAPI drains a backlog of events
// through WrapTx's HandleConcurrent, far wider than the pool, whose handlers
// hold their transactions until the test lets them go (each also queries
// the pool outside its transaction), while an HTTP API on the same pool
// (idemhttp.NewTx and a plain query) is called: the inbox holds its bound
// and no more, the rest of the backlog waiting, and every request answers
// while the backlog is held.
func TestTxConnsBacklogLeavesThePoolToTheAPI(t *testing.T) {
	const total, maxConns = 50, 8
	pool := postgresPoolOf(t, maxConns)
	store := newPostgresStore(t, pool)
	bound := store.TxConns()
	require.Equal(t, 6, bound)
	ledger, refunds := newLedger(t, pool), newLedger(t, pool)
	// A failed test lets its handlers go before the tables and the pool.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	var inTx, maxInTx atomic.Int32
	raise := func(m *atomic.Int32, v int32) {
		for old := m.Load(); v > old && !m.CompareAndSwap(old, v); old = m.Load() {
		}
	}
	entered := make(chan string, total)
	release := make(chan struct{})
	w, err := dedup.WrapTx(store, events, func(ctx context.Context, tx pgx.Tx, e event) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+ledger+` (event_id, body) VALUES ($1, $2)`, e.ID, e.Body); err != nil {
			return err
		}
		// A query of the handler's own outside tx, on the same pool, finds
		// a connection the bound left.
		var one int
		if err := pool.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
			return err
		}
		raise(&maxInTx, inTx.Add(1))
		defer inTx.Add(-1)
		entered <- e.ID
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, dedup.WithScope(uniqueScope(t)), dedup.WithSink(dedup.NewMemorySink()))
	require.NoError(t, err)

	// The API: a refund in an idemhttp transaction, and a plain query. Each
	// answers with how many events had committed when it ran.
	var apiAcquired atomic.Int32
	committed := func(ctx context.Context, q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) (int, error) {
		raise(&apiAcquired, pool.Stat().AcquiredConns())
		var n int
		err := q.QueryRow(ctx, `SELECT count(*) FROM `+ledger).Scan(&n)
		return n, err
	}
	m, err := idemhttp.NewTx(store, pool, idemhttp.WithScope(uniqueScope(t)+"-api"))
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /refunds", m.Wrap(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) {
		n, err := committed(r.Context(), tx)
		if err == nil {
			_, err = tx.Exec(r.Context(), `INSERT INTO `+refunds+` (event_id, body) VALUES ($1, 'refund')`, r.Header.Get("Idempotency-Key"))
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, n)
	}))
	mux.HandleFunc("GET /processed", func(w http.ResponseWriter, r *http.Request) {
		n, err := committed(r.Context(), pool)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, n)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	client := &http.Client{Timeout: noProgress}
	call := func(method, path, key string) int {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(`{}`))
		require.NoError(t, err)
		if key != "" {
			req.Header.Set("Idempotency-Key", strconv.Quote(key))
		}
		resp, err := client.Do(req)
		require.NoError(t, err, "%s %s while the inbox holds %d of the pool's %d connections", method, path, bound, maxConns)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Less(t, resp.StatusCode, 300, "%s %s: %s", method, path, body)
		n, err := strconv.Atoi(string(body))
		require.NoError(t, err, "%s %s: %s", method, path, body)
		return n
	}

	msgs := make([]event, total)
	for i := range msgs {
		msgs[i] = event{ID: fmt.Sprintf("evt-%02d", i), Body: "payment " + strconv.Itoa(i)}
	}
	results := make([]dedup.Result, total)
	errs := make([]error, total)
	drained := make(chan error, 1)
	go func() {
		drained <- w.HandleConcurrent(ctx, msgs, func(i int, res dedup.Result, err error) {
			results[i], errs[i] = res, err
		})
	}()

	requests := 0
	for left, round := total, 0; left > 0; round++ {
		// The inbox fills up to its bound, the rest of the backlog waiting
		// for a slot: nobody enters or leaves until the test lets go.
		want := min(bound, left)
		for range want {
			select {
			case <-entered:
			case err := <-drained:
				t.Fatalf("round %d: HandleConcurrent returned (%v) with %d events held back", round, err, left)
			case <-time.After(noProgress):
				t.Fatalf("round %d: no handler entered for %s; %d in their transactions, %d events left", round, noProgress, inTx.Load(), left)
			}
		}
		require.EqualValues(t, want, inTx.Load(), "round %d: handlers in their transactions", round)
		require.LessOrEqual(t, pool.Stat().AcquiredConns(), int32(bound), "round %d: connections held with the inbox full", round)

		// The API answers on the same pool while the backlog is held.
		for _, n := range []int{
			call(http.MethodPost, "/refunds", fmt.Sprintf("refund-%d-%s", round, rand.Text())),
			call(http.MethodGet, "/processed", ""),
		} {
			// The backlog had not drained: the held events had not committed.
			require.LessOrEqual(t, n, total-left, "round %d: events committed when the API answered", round)
		}
		requests += 2
		for range want {
			release <- struct{}{}
		}
		left -= want
	}
	select {
	case err := <-drained:
		require.NoError(t, err)
	case <-time.After(noProgress):
		t.Fatalf("HandleConcurrent did not return %s after its last handler was let go", noProgress)
	}

	for i := range total {
		require.NoError(t, errs[i], msgs[i].ID)
		require.Equal(t, dedup.OutcomeProcessed, results[i].Outcome, msgs[i].ID)
	}
	var rows, distinct int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM `+ledger).Scan(&rows, &distinct))
	require.Equal(t, total, rows, "effects")
	require.Equal(t, total, distinct, "events with an effect")
	require.Equal(t, requests/2, countAll(t, pool, refunds), "refunds")
	require.EqualValues(t, bound, maxInTx.Load(), "most handlers in their transactions at once")
	require.LessOrEqual(t, apiAcquired.Load(), int32(bound+1), "connections held when the API ran, its own included")
}

func countAll(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&n))
	return n
}

// TestTxConnsWaitHonoursContext cancels a delivery waiting for the inbox's
// only slot: it returns at once with the context's error, recorded nowhere,
// and runs once delivered again.
func TestTxConnsWaitHonoursContext(t *testing.T) {
	pool := postgresPoolOf(t, 4)
	store, err := dedup.NewPostgresStore(pool, dedup.WithTable("dedup_wrapper_test"), dedup.WithTxConns(1))
	require.NoError(t, err)
	ledger := newLedger(t, pool)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var runs atomic.Int32
	w, err := dedup.WrapTx(store, events, func(ctx context.Context, tx pgx.Tx, e event) error {
		runs.Add(1)
		if e.Body == "hold" {
			entered <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+ledger+` (event_id, body) VALUES ($1, $2)`, e.ID, e.Body)
		return err
	}, dedup.WithScope(uniqueScope(t)), dedup.WithSink(dedup.NewMemorySink()))
	require.NoError(t, err)

	type outcome struct {
		res dedup.Result
		err error
	}
	first := make(chan outcome, 1)
	go func() {
		res, err := w.Handle(ctx, event{ID: "holder", Body: "hold"})
		first <- outcome{res, err}
	}()
	select {
	case <-entered:
	case <-time.After(noProgress):
		t.Fatalf("the first delivery's handler did not run within %s", noProgress)
	}

	waitCtx, cancel := context.WithCancel(ctx)
	second := make(chan outcome, 1)
	go func() {
		res, err := w.Handle(waitCtx, event{ID: "waiter", Body: "wait"})
		second <- outcome{res, err}
	}()
	cancel()
	var got outcome
	select {
	case got = <-second:
	case <-time.After(noProgress):
		t.Fatalf("a delivery whose context was cancelled still waits for a slot after %s", noProgress)
	}
	require.ErrorIs(t, got.err, context.Canceled)
	require.Contains(t, got.err.Error(), "waiting for one of the 1 connections the inbox may hold")
	require.NotEqual(t, dedup.OutcomeProcessed, got.res.Outcome)
	require.EqualValues(t, 1, runs.Load(), "the waiting delivery's handler ran")
	_, err = store.Get(ctx, dedup.Key{Scope: w.Scope(), EventID: "waiter"})
	require.ErrorIs(t, err, dedup.ErrNotFound)
	require.Empty(t, first, "the first delivery ended while it held the slot")

	close(release)
	var res outcome
	select {
	case res = <-first:
	case <-time.After(noProgress):
		t.Fatalf("the first delivery did not end within %s of its handler's release", noProgress)
	}
	require.NoError(t, res.err)
	require.Equal(t, dedup.OutcomeProcessed, res.res.Outcome)
	again, err := w.Handle(ctx, event{ID: "waiter", Body: "wait"})
	require.NoError(t, err)
	require.Equal(t, dedup.OutcomeProcessed, again.Outcome)
	require.Equal(t, 1, countRows(t, pool, ledger, "waiter"))
	require.Equal(t, 1, countRows(t, pool, ledger, "holder"))
}
