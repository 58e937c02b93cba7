package idemhttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/idemhttp"
	"github.com/dedupkit/dedup/internal/testenv"
)

// chargesTable creates a table of charges, the business rows of the
// transactional tests, dropped when t ends.
func chargesTable(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	table := pgx.Identifier{uniqueName("charges_")}.Sanitize()
	if _, err := pool.Exec(context.Background(), "CREATE TABLE "+table+" (id bigserial PRIMARY KEY, amount bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	return table
}

func countRows(t testing.TB, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// txCharge inserts a charge in tx and answers its row ID; status, when not
// zero, replaces the answer (to test rollbacks).
func txCharge(table string, status *int) idemhttp.TxHandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) {
		var req struct {
			Amount int64 `json:"amount"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Amount <= 0 {
			http.Error(w, "bad amount", http.StatusBadRequest)
			return
		}
		var id int64
		if err := tx.QueryRow(r.Context(), "INSERT INTO "+table+" (amount) VALUES ($1) RETURNING id", req.Amount).Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if status != nil && *status != 0 {
			http.Error(w, "gateway down", *status)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"amount":%d}`, id, req.Amount)
	}
}

func newTxServer(t *testing.T, status *int, opts ...idemhttp.Opt) (url string, pool *pgxpool.Pool, charges string) {
	t.Helper()
	store, pool := postgresStore(t)
	charges = chargesTable(t, pool)
	m, err := idemhttp.NewTx(store, pool, append([]idemhttp.Opt{idemhttp.WithScope("payments-api"),
		idemhttp.WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, m.Wrap(txCharge(charges, status))).URL, pool, charges
}

// TestTxConcurrentRequestsOneRow: 50 requests with one key at once in
// transactional mode commit one charge row; the rest wait for it and replay.
func TestTxConcurrentRequestsOneRow(t *testing.T) {
	url, pool, charges := newTxServer(t, nil)
	answers := sendAtOnce(t, url, newKey(), 50)
	if n := countRows(t, pool, charges); n != 1 {
		t.Fatalf("%d charge rows, want 1", n)
	}
	originals, replays := 0, 0
	var body string
	for _, a := range answers {
		switch {
		case a.status == http.StatusCreated && !a.replayed():
			originals++
			body = a.body
		case a.status == http.StatusCreated:
			replays++
		default:
			t.Errorf("unexpected %d %q", a.status, a.body)
		}
	}
	for _, a := range answers {
		if a.body != body {
			t.Errorf("answer %q differs from the original %q", a.body, body)
		}
	}
	if originals != 1 {
		t.Errorf("%d originals, want 1", originals)
	}
	t.Logf("1 row: 1 original, %d replays", replays)
}

// TestTxFailureRollsBack: a 5xx rolls the handler's row and the key back,
// so the retry runs afresh and one row remains.
func TestTxFailureRollsBack(t *testing.T) {
	status := http.StatusServiceUnavailable
	url, pool, charges := newTxServer(t, &status)
	key := newKey()
	if a := mustPost(t, url, key, order); a.status != http.StatusServiceUnavailable {
		t.Fatalf("first: %d %q", a.status, a.body)
	}
	if n := countRows(t, pool, charges); n != 0 {
		t.Fatalf("%d rows after a 503, want 0", n)
	}
	status = 0
	first := mustPost(t, url, key, order)
	again := mustPost(t, url, key, order)
	if first.status != http.StatusCreated || first.replayed() || !again.replayed() || again.body != first.body {
		t.Errorf("retry %d %q then %d %q", first.status, first.body, again.status, again.body)
	}
	if reused := mustPost(t, url, key, `{"amount": 7}`); reused.status != http.StatusUnprocessableEntity {
		t.Errorf("reused key: %d", reused.status)
	}
	if n := countRows(t, pool, charges); n != 1 {
		t.Errorf("%d rows, want 1", n)
	}
}

// TestTxOversizedAnswerRollsBack: an answer that cannot be stored is not
// committed either; the client gets a 500 problem.
func TestTxOversizedAnswerRollsBack(t *testing.T) {
	url, pool, charges := newTxServer(t, nil, idemhttp.WithMaxSnapshotBytes(8))
	a := mustPost(t, url, newKey(), order)
	if a.status != http.StatusInternalServerError || a.problemType() != problem(idemhttp.ProblemTooLarge) {
		t.Errorf("oversized: %d %q", a.status, a.body)
	}
	if !strings.Contains(a.body, "over the 8 bytes") {
		t.Errorf("the detail does not name the limit: %q", a.body)
	}
	if n := countRows(t, pool, charges); n != 0 {
		t.Errorf("%d rows, want 0", n)
	}
}

// TestTxRetryingClient: a client retrying through lost responses ends with
// the first answer, and one row.
func TestTxRetryingClient(t *testing.T) {
	url, pool, charges := newTxServer(t, nil)
	client := &http.Client{Transport: &dropTransport{base: http.DefaultTransport, drops: 2}}
	key := newKey()
	var got answer
	for range 5 {
		a, err := post(t, client, url, key, order)
		if err == nil {
			got = a
			break
		}
	}
	var id int64
	if err := pool.QueryRow(context.Background(), "SELECT id FROM "+charges).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf(`{"id":%d,"amount":4200}`, id); got.body != want || !got.replayed() {
		t.Errorf("client got %q replayed=%v, want %q", got.body, got.replayed(), want)
	}
	if n := countRows(t, pool, charges); n != 1 {
		t.Errorf("%d rows, want 1", n)
	}
}

// TestTxLockTimeoutIsInFlight: with a lock_timeout on the pool, a request
// waiting on a running request's key is answered 409 in flight, not held.
func TestTxLockTimeoutIsInFlight(t *testing.T) {
	setup := testenv.Postgres(t)
	cfg := setup.Config()
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = "200ms"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := dedup.NewPostgresStore(pool, dedup.WithTable(recordsTable(t, setup)))
	if err != nil {
		t.Fatal(err)
	}
	m, err := idemhttp.NewTx(store, pool, idemhttp.WithScope("payments-api"), idemhttp.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}, 1), make(chan struct{})
	srv := serve(t, m.Wrap(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) {
		entered <- struct{}{}
		<-release
		w.WriteHeader(http.StatusCreated)
	}))
	key := newKey()
	done := make(chan answer)
	go func() { done <- mustPost(t, srv.URL, key, order) }()
	<-entered
	if a := mustPost(t, srv.URL, key, order); a.status != http.StatusConflict || a.problemType() != problem(idemhttp.ProblemInFlight) {
		t.Errorf("waiter past lock_timeout: %d %q", a.status, a.body)
	}
	close(release)
	if a := <-done; a.status != http.StatusCreated {
		t.Errorf("first: %d", a.status)
	}
	if a := mustPost(t, srv.URL, key, order); !a.replayed() {
		t.Errorf("after: %d replayed=%v", a.status, a.replayed())
	}
}

// TestTxKeyless: with WithOptionalKey a request without a key runs in a
// transaction of its own, committed on 2xx and rolled back on 5xx.
func TestTxKeyless(t *testing.T) {
	status := 0
	url, pool, charges := newTxServer(t, &status, idemhttp.WithOptionalKey())
	if a := mustPost(t, url, "", order); a.status != http.StatusCreated {
		t.Fatalf("keyless: %d %q", a.status, a.body)
	}
	status = http.StatusServiceUnavailable
	if a := mustPost(t, url, "", order); a.status != http.StatusServiceUnavailable {
		t.Fatalf("keyless 503: %d", a.status)
	}
	if n := countRows(t, pool, charges); n != 1 {
		t.Errorf("%d rows, want 1 (the 503's rolled back)", n)
	}
}

// txServer serves h in transactional mode on a fresh records table.
func txServer(t *testing.T, h func(charges string) idemhttp.TxHandlerFunc, opts ...idemhttp.Opt) (url string, pool *pgxpool.Pool, charges string) {
	t.Helper()
	store, pool := postgresStore(t)
	charges = chargesTable(t, pool)
	m, err := idemhttp.NewTx(store, pool, append([]idemhttp.Opt{idemhttp.WithScope("payments-api"),
		idemhttp.WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, m.Wrap(h(charges))).URL, pool, charges
}

// TestTxHandlerCannotEndItsTx: a handler that commits or rolls back the tx
// it was given gets ErrTxOwned and changes nothing; its request is answered
// 500 handler-ended-transaction with nothing applied, whatever it answered,
// and the key stays retryable (it used to commit the claim without its
// answer: the key stuck, every retry a 500, until its TTL).
func TestTxHandlerCannotEndItsTx(t *testing.T) {
	var mode atomic.Value // "commit", "rollback" or "ok"
	var runs atomic.Int64
	url, pool, charges := txServer(t, func(charges string) idemhttp.TxHandlerFunc {
		return func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) {
			runs.Add(1)
			if _, err := tx.Exec(r.Context(), "INSERT INTO "+charges+" (amount) VALUES (4200)"); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			var err error
			switch mode.Load() {
			case "commit":
				err = tx.Commit(r.Context())
			case "rollback":
				err = tx.Rollback(r.Context())
			}
			if mode.Load() != "ok" && !errors.Is(err, idemhttp.ErrTxOwned) {
				t.Errorf("%s: %v, want ErrTxOwned", mode.Load(), err)
			}
			w.WriteHeader(http.StatusCreated) // the error ignored
			fmt.Fprintf(w, "run %d", runs.Load())
		}
	})
	key := newKey()
	for _, m := range []string{"commit", "rollback"} {
		mode.Store(m)
		if a := mustPost(t, url, key, order); a.status != http.StatusInternalServerError || a.problemType() != problem(idemhttp.ProblemTxEnded) {
			t.Errorf("%s by the handler: %d %q, want 500 handler-ended-transaction", m, a.status, a.body)
		}
		if n := countRows(t, pool, charges); n != 0 {
			t.Errorf("%s by the handler: %d rows, want 0", m, n)
		}
	}
	mode.Store("ok")
	first := mustPost(t, url, key, order)
	again := mustPost(t, url, key, order)
	if first.status != http.StatusCreated || first.body != "run 3" || !again.replayed() || again.body != first.body {
		t.Errorf("retry %d %q, then %d replayed=%v %q", first.status, first.body, again.status, again.replayed(), again.body)
	}
	if n := countRows(t, pool, charges); n != 1 {
		t.Errorf("%d rows, want 1", n)
	}
}

// TestTxFailedStatementThenFinalAnswer: a handler whose statement fails
// (aborting the transaction) and that then answers a final 422 has that
// answer stored and replayed, without its writes; one that answers 201 after
// a failed statement gets a 500 transaction-aborted instead, nothing is
// applied, and its retry runs afresh. A request without a key is answered
// the same way.
func TestTxFailedStatementThenFinalAnswer(t *testing.T) {
	var mode atomic.Value // "refuse", "ignore" or "ok"
	var runs atomic.Int64
	url, pool, charges := txServer(t, func(charges string) idemhttp.TxHandlerFunc {
		return func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) {
			runs.Add(1)
			if _, err := tx.Exec(r.Context(), "INSERT INTO "+charges+" (amount) VALUES (4200)"); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			switch mode.Load() {
			case "refuse": // a statement fails, the handler refuses the request
				if _, err := tx.Exec(r.Context(), "INSERT INTO "+charges+" (amount) VALUES (NULL)"); err != nil {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusUnprocessableEntity)
					io.WriteString(w, `{"error":"amount refused"}`)
					return
				}
			case "ignore": // a statement fails, the handler ignores it
				_, _ = tx.Exec(r.Context(), "INSERT INTO "+charges+" (amount) VALUES (NULL)")
			}
			w.WriteHeader(http.StatusCreated)
		}
	}, idemhttp.WithOptionalKey())
	mode.Store("refuse")
	key := newKey()
	first := mustPost(t, url, key, order)
	again := mustPost(t, url, key, order)
	if first.status != http.StatusUnprocessableEntity || first.body != `{"error":"amount refused"}` || first.replayed() {
		t.Errorf("final 422 after a failed statement: %d %q", first.status, first.body)
	}
	if again.status != http.StatusUnprocessableEntity || !again.replayed() || again.body != first.body {
		t.Errorf("retry: %d replayed=%v %q, want the stored 422", again.status, again.replayed(), again.body)
	}
	if n := countRows(t, pool, charges); n != 0 {
		t.Errorf("%d rows after a refused request, want 0", n)
	}

	mode.Store("ignore")
	runs.Store(0)
	key = newKey()
	if a := mustPost(t, url, key, order); a.status != http.StatusInternalServerError || a.problemType() != problem(idemhttp.ProblemTxAborted) {
		t.Errorf("201 after a failed statement: %d %q, want 500 transaction-aborted", a.status, a.body)
	}
	if n := countRows(t, pool, charges); n != 0 {
		t.Errorf("%d rows after an aborted transaction, want 0", n)
	}
	mode.Store("ok")
	if a := mustPost(t, url, key, order); a.status != http.StatusCreated || a.replayed() || runs.Load() != 2 {
		t.Errorf("retry: %d replayed=%v after %d runs, want a second run", a.status, a.replayed(), runs.Load())
	}
	if n := countRows(t, pool, charges); n != 1 {
		t.Errorf("%d rows, want 1", n)
	}

	mode.Store("ignore")
	if a := mustPost(t, url, "", order); a.status != http.StatusInternalServerError || a.problemType() != problem(idemhttp.ProblemTxAborted) {
		t.Errorf("keyless 201 after a failed statement: %d %q, want 500 transaction-aborted", a.status, a.body)
	}
	mode.Store("refuse")
	if a := mustPost(t, url, "", order); a.status != http.StatusUnprocessableEntity {
		t.Errorf("keyless final 422 after a failed statement: %d %q", a.status, a.body)
	}
	if n := countRows(t, pool, charges); n != 1 {
		t.Errorf("%d rows after keyless requests whose statement failed, want 1", n)
	}
}

// TestTxUnreplayableHeadersRollBack: an answer whose stored headers could
// not be replayed (a control character) is not committed; the client gets
// a 500 problem and its retry runs afresh.
func TestTxUnreplayableHeadersRollBack(t *testing.T) {
	var runs atomic.Int64
	url, pool, charges := txServer(t, func(charges string) idemhttp.TxHandlerFunc {
		return func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) {
			if _, err := tx.Exec(r.Context(), "INSERT INTO "+charges+" (amount) VALUES (4200)"); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if runs.Add(1) == 1 {
				w.Header().Set("Location", "/payments/\x01")
			}
			w.WriteHeader(http.StatusCreated)
		}
	})
	key := newKey()
	if a := mustPost(t, url, key, order); a.status != http.StatusInternalServerError || a.problemType() != problem(idemhttp.ProblemUnstorable) {
		t.Errorf("unreplayable headers: %d %q, want 500 response-unstorable", a.status, a.body)
	}
	if n := countRows(t, pool, charges); n != 0 {
		t.Errorf("%d rows, want 0", n)
	}
	if a := mustPost(t, url, key, order); a.status != http.StatusCreated || a.replayed() {
		t.Errorf("retry: %d replayed=%v, want a second run", a.status, a.replayed())
	}
	if n := countRows(t, pool, charges); n != 1 {
		t.Errorf("%d rows, want 1", n)
	}
}

// TestTxFailedStatementFailureRecordedInItsTx: a handler whose statement
// fails and that answers 500 has its failure recorded in its own
// transaction on the first try (no settling write retried), the attempt
// counted and the key left retryable; the next request with it runs
// afresh and counts a second attempt.
func TestTxFailedStatementFailureRecordedInItsTx(t *testing.T) {
	store, pool := postgresStore(t)
	charges := chargesTable(t, pool)
	var logs strings.Builder
	var mu sync.Mutex
	m, err := idemhttp.NewTx(store, pool, idemhttp.WithScope("payments-api"),
		idemhttp.WithLogger(slog.New(slog.NewTextHandler(&syncWriter{w: &logs, mu: &mu}, nil))))
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, m.Wrap(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) {
		if _, err := tx.Exec(r.Context(), "INSERT INTO "+charges+" (amount) VALUES (4200)"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if _, err := tx.Exec(r.Context(), "SELECT 1/0"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})).URL
	key := newKey()
	for attempt := 1; attempt <= 2; attempt++ {
		if a := mustPost(t, url, key, order); a.status != http.StatusInternalServerError || a.replayed() {
			t.Fatalf("attempt %d: %d replayed=%v, want the handler's 500", attempt, a.status, a.replayed())
		}
		rec, err := store.Get(context.Background(), dedup.Key{Scope: "payments-api", EventID: key})
		if err != nil {
			t.Fatal(err)
		}
		if rec.Status != dedup.StatusFailedRetryable || rec.Attempts != attempt || !strings.Contains(rec.LastError, "500") {
			t.Errorf("attempt %d: record %s, %d attempts, %q; want failed-retryable, counted", attempt, rec.Status, rec.Attempts, rec.LastError)
		}
	}
	if n := countRows(t, pool, charges); n != 0 {
		t.Errorf("%d rows, want 0", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(logs.String(), "outcome not recorded") {
		t.Errorf("a settling write was retried:\n%s", logs.String())
	}
	if err := m.Health(); err != nil {
		t.Errorf("Health: %v", err)
	}
}
