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

// holder is a TxHandler that writes each event's effect in its transaction
// and then holds the transaction until the test lets it go, counting the
// handlers holding one.
type holder struct {
	ledger  string
	outside *pgxpool.Pool // when set, queried outside the transaction too
	entered chan string
	release chan struct{}
	left    chan struct{} // a released handler is out: its in no longer counts
	in      atomic.Int32
	most    atomic.Int32
}

func newHolder(ledger string, events int) *holder {
	return &holder{ledger: ledger, entered: make(chan string, events), release: make(chan struct{}), left: make(chan struct{}, events)}
}

func (h *holder) handle(ctx context.Context, tx pgx.Tx, e event) error {
	if _, err := tx.Exec(ctx, `INSERT INTO `+h.ledger+` (event_id, body) VALUES ($1, $2)`, e.ID, e.Body); err != nil {
		return err
	}
	if h.outside != nil {
		var one int
		if err := h.outside.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
			return err
		}
	}
	n := h.in.Add(1)
	for most := h.most.Load(); n > most && !h.most.CompareAndSwap(most, n); most = h.most.Load() {
	}
	h.entered <- e.ID
	select {
	case <-h.release:
		h.in.Add(-1)
		h.left <- struct{}{}
		return nil
	case <-ctx.Done():
		h.in.Add(-1)
		return ctx.Err()
	}
}

// fill waits for n more handlers to enter, each within noProgress.
func (h *holder) fill(t *testing.T, round, n int) {
	t.Helper()
	for range n {
		select {
		case <-h.entered:
		case <-time.After(noProgress):
			t.Fatalf("round %d: no handler entered for %s; %d holding their transactions", round, noProgress, h.in.Load())
		}
	}
}

// letGo lets n handlers return, and waits until they no longer count as
// holding their transactions: the next round counts only its own.
func (h *holder) letGo(n int) {
	for range n {
		h.release <- struct{}{}
		<-h.left
	}
}

// await returns what f returns, or fails t when f has not returned within
// noProgress.
func await[T any](t *testing.T, what string, f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(noProgress):
		t.Fatalf("%s: not done within %s", what, noProgress)
		panic("unreachable")
	}
}

// requireEffectsOnce checks that ledger holds one effect for each of n
// events.
func requireEffectsOnce(t *testing.T, pool *pgxpool.Pool, ledger string, n int) {
	t.Helper()
	var rows, distinct int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT event_id) FROM `+ledger).Scan(&rows, &distinct))
	require.Equal(t, n, rows, "effects")
	require.Equal(t, n, distinct, "events with an effect")
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

	h := newHolder(ledger, total)
	h.outside = pool
	w, err := dedup.WrapTx(store, events, h.handle, dedup.WithScope(uniqueScope(t)), dedup.WithSink(dedup.NewMemorySink()))
	require.NoError(t, err)

	// The API: a refund in an idemhttp transaction, and a plain query. Each
	// answers with how many events had committed when it ran.
	var apiAcquired atomic.Int32
	committed := func(ctx context.Context, q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) (int, error) {
		if n := pool.Stat().AcquiredConns(); n > apiAcquired.Load() {
			apiAcquired.Store(n) // the requests come one at a time
		}
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

	refundsMade := 0
	for left, round := total, 0; left > 0; round++ {
		// The inbox fills up to its bound, the rest of the backlog waiting
		// for a slot: nobody enters or leaves until the test lets go.
		want := min(bound, left)
		h.fill(t, round, want)
		require.EqualValues(t, want, h.in.Load(), "round %d: handlers holding their transactions", round)
		require.LessOrEqual(t, pool.Stat().AcquiredConns(), int32(bound), "round %d: connections held with the inbox full", round)

		// The API answers on the same pool while the backlog is held.
		for _, n := range []int{
			call(http.MethodPost, "/refunds", fmt.Sprintf("refund-%d-%s", round, rand.Text())),
			call(http.MethodGet, "/processed", ""),
		} {
			// The backlog had not drained: the held events had not committed.
			require.LessOrEqual(t, n, total-left, "round %d: events committed when the API answered", round)
		}
		refundsMade++
		h.letGo(want)
		left -= want
	}
	require.NoError(t, await(t, "HandleConcurrent, its last handler let go", func() error { return <-drained }))

	for i := range total {
		require.NoError(t, errs[i], msgs[i].ID)
		require.Equal(t, dedup.OutcomeProcessed, results[i].Outcome, msgs[i].ID)
	}
	requireEffectsOnce(t, pool, ledger, total)
	requireEffectsOnce(t, pool, refunds, refundsMade)
	require.EqualValues(t, bound, h.most.Load(), "most handlers holding their transactions at once")
	require.LessOrEqual(t, apiAcquired.Load(), int32(bound+1), "connections held when the API ran, its own included")
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
	h := newHolder(ledger, 2)
	w, err := dedup.WrapTx(store, events, h.handle, dedup.WithScope(uniqueScope(t)), dedup.WithSink(dedup.NewMemorySink()))
	require.NoError(t, err)

	type outcome struct {
		res dedup.Result
		err error
	}
	handle := func(ctx context.Context, id string) func() outcome {
		return func() outcome {
			res, err := w.Handle(ctx, event{ID: id, Body: id})
			return outcome{res, err}
		}
	}
	first := make(chan outcome, 1)
	go func() { first <- handle(ctx, "holder")() }()
	h.fill(t, 0, 1)

	waitCtx, stop := context.WithCancel(ctx)
	second := make(chan outcome, 1)
	go func() { second <- handle(waitCtx, "waiter")() }()
	stop()
	got := await(t, "a delivery whose context was cancelled while it waited for a slot", func() outcome { return <-second })
	require.ErrorIs(t, got.err, context.Canceled)
	require.NotEqual(t, dedup.OutcomeProcessed, got.res.Outcome)
	require.Empty(t, h.entered, "the waiting delivery's handler ran")
	_, err = store.Get(ctx, dedup.Key{Scope: w.Scope(), EventID: "waiter"})
	require.ErrorIs(t, err, dedup.ErrNotFound)
	require.Empty(t, first, "the first delivery ended while it held the slot")

	h.letGo(1)
	res := await(t, "the first delivery, its handler let go", func() outcome { return <-first })
	require.NoError(t, res.err)
	require.Equal(t, dedup.OutcomeProcessed, res.res.Outcome)
	// Its slot was given back: the waiter delivered again runs in it.
	close(h.release)
	again := await(t, "the cancelled delivery, delivered again", handle(ctx, "waiter"))
	require.NoError(t, again.err)
	require.Equal(t, dedup.OutcomeProcessed, again.res.Outcome)
	requireEffectsOnce(t, pool, ledger, 2)
}

// TestTxConnsSharedByWrappers runs two WrapTx wrappers on one store with a
// bound of 2: together they never hold more. A third one's HandleBatch,
// cancelled while both slots are held, records nothing and succeeds none of
// its events; delivered again, they run once, and each batch's transaction
// gives its slot back.
func TestTxConnsSharedByWrappers(t *testing.T) {
	const perWrapper, bound = 3, 2
	pool := postgresPoolOf(t, 4)
	store, err := dedup.NewPostgresStore(pool, dedup.WithTable("dedup_wrapper_test"), dedup.WithTxConns(bound))
	require.NoError(t, err)
	ledger := newLedger(t, pool)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	h := newHolder(ledger, 2*perWrapper)
	wrap := func(scope string, th dedup.TxHandler[event]) *dedup.Wrapper[event] {
		w, err := dedup.WrapTx(store, events, th, dedup.WithScope(uniqueScope(t)+scope), dedup.WithSink(dedup.NewMemorySink()))
		require.NoError(t, err)
		return w
	}
	wrappers := []*dedup.Wrapper[event]{wrap("-a", h.handle), wrap("-b", h.handle)}
	late := wrap("-c", func(ctx context.Context, tx pgx.Tx, e event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+ledger+` (event_id, body) VALUES ($1, $2)`, e.ID, e.Body)
		return err
	})
	// lateBatch runs msgs through late's HandleBatch and returns the error
	// of each result (a success that is not OutcomeProcessed is one) and
	// HandleBatch's.
	lateBatch := func(ctx context.Context, msgs []event) func() []error {
		return func() []error {
			var errs []error
			err := late.HandleBatch(ctx, msgs, func(i int, res dedup.Result, err error) bool {
				if err == nil && res.Outcome != dedup.OutcomeProcessed {
					err = fmt.Errorf("%s: outcome %v", msgs[i].ID, res.Outcome)
				}
				errs = append(errs, err)
				return true
			})
			return append(errs, err)
		}
	}

	drained := make(chan error, len(wrappers))
	for k, w := range wrappers {
		msgs := make([]event, perWrapper)
		for i := range msgs {
			msgs[i] = event{ID: fmt.Sprintf("w%d-%d", k, i), Body: "shared"}
		}
		go func() {
			drained <- w.HandleConcurrent(ctx, msgs, func(i int, res dedup.Result, err error) {
				if err == nil && res.Outcome != dedup.OutcomeProcessed {
					err = fmt.Errorf("outcome %v", res.Outcome)
				}
				if err != nil {
					t.Errorf("%s: %v", msgs[i].ID, err)
				}
			})
		}()
	}
	lateMsgs := []event{{ID: "late-0", Body: "late"}, {ID: "late-1", Body: "late"}}
	for left, round := 2*perWrapper, 0; left > 0; round++ {
		want := min(bound, left)
		h.fill(t, round, want)
		require.EqualValues(t, want, h.in.Load(), "round %d: handlers of both wrappers holding their transactions", round)
		if round == 0 {
			// Both slots are held: a third wrapper's batch waits for one,
			// and leaves when its context is cancelled, succeeding nothing.
			waitCtx, stop := context.WithCancel(ctx)
			done := make(chan []error, 1)
			go func() { done <- lateBatch(waitCtx, lateMsgs)() }()
			stop()
			for _, err := range await(t, "a HandleBatch whose context was cancelled while it waited for a slot", func() []error { return <-done }) {
				if err != nil {
					require.ErrorIs(t, err, context.Canceled)
				}
			}
			for _, m := range lateMsgs {
				_, err := store.Get(ctx, dedup.Key{Scope: late.Scope(), EventID: m.ID})
				require.ErrorIs(t, err, dedup.ErrNotFound, m.ID)
			}
		}
		h.letGo(want)
		left -= want
	}
	for range wrappers {
		require.NoError(t, await(t, "HandleConcurrent, its last handler let go", func() error { return <-drained }))
	}
	require.EqualValues(t, bound, h.most.Load(), "most handlers of the two wrappers holding their transactions at once")

	// With the bound at 2, a batch that kept its slot would leave the third
	// of these waiting for ever.
	for _, msgs := range [][]event{lateMsgs, {{ID: "late-2", Body: "late"}}, {{ID: "late-3", Body: "late"}}} {
		errs := await(t, "HandleBatch of "+msgs[0].ID, lateBatch(ctx, msgs))
		require.Len(t, errs, len(msgs)+1)
		for _, err := range errs {
			require.NoError(t, err)
		}
	}
	requireEffectsOnce(t, pool, ledger, 2*perWrapper+4)
}
