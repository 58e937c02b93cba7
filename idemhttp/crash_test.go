package idemhttp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/idemhttp"
	"github.com/dedupkit/dedup/internal/testenv"
)

// crashEnv, when set, makes the test binary a server process that charges
// and then hangs (see crashWorker), for the parent to SIGKILL.
const crashEnv = "IDEMHTTP_CRASH_WORKER"

// TestMain runs the binary as a crash worker when crashEnv is set.
func TestMain(m *testing.M) {
	if cfg := os.Getenv(crashEnv); cfg != "" {
		os.Exit(crashWorker(cfg))
	}
	os.Exit(m.Run())
}

// crashConfig tells a worker what to serve.
type crashConfig struct {
	DSN     string        `json:"dsn"`
	Records string        `json:"records"` // the dedup table
	Charges string        `json:"charges"` // the business table, quoted
	Tx      bool          `json:"tx"`
	Lease   time.Duration `json:"lease"`
}

// crashHandler inserts a charge through q, prints "charged" and, when hang
// is set, never answers: the process is killed mid-handler.
func crashHandler(cfg crashConfig, hang bool, q func(*http.Request) (pgx.Tx, func(), error)) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		tx, done, err := q(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer done()
		var id int64
		if err := tx.QueryRow(r.Context(), "INSERT INTO "+cfg.Charges+" (amount) VALUES (4200) RETURNING id").Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if hang {
			fmt.Println("charged")
			select {}
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	}
}

// crashServer builds the server a worker (hang) or the restarted parent
// (!hang) runs over the same tables.
func crashServer(ctx context.Context, cfg crashConfig, hang bool) (http.Handler, *pgxpool.Pool, error) {
	pool, err := pgxpool.New(ctx, cfg.DSN)
	if err != nil {
		return nil, nil, err
	}
	store, err := dedup.NewPostgresStore(pool, dedup.WithTable(cfg.Records))
	if err != nil {
		return nil, nil, err
	}
	opts := []idemhttp.Opt{idemhttp.WithScope("payments-api"), idemhttp.WithLogger(slog.New(slog.DiscardHandler))}
	if cfg.Tx { // no lease: the row lock is the claim
		m, err := idemhttp.NewTx(store, pool, opts...)
		if err != nil {
			return nil, nil, err
		}
		return m.Wrap(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) {
			crashHandler(cfg, hang, func(*http.Request) (pgx.Tx, func(), error) { return tx, func() {}, nil })(w, r)
		}), pool, nil
	}
	m, err := idemhttp.New(store, append(opts, idemhttp.WithLease(cfg.Lease))...)
	if err != nil {
		return nil, nil, err
	}
	// Claim mode: the charge commits on its own, before the answer.
	return m.Wrap(http.HandlerFunc(crashHandler(cfg, hang, func(r *http.Request) (pgx.Tx, func(), error) {
		tx, err := pool.Begin(r.Context())
		if err != nil {
			return nil, nil, err
		}
		return &autoCommit{tx}, func() { _ = tx.Rollback(context.Background()) }, nil
	}))), pool, nil
}

// autoCommit commits its transaction after each query, so that claim
// mode's charge is durable before the handler hangs.
type autoCommit struct{ pgx.Tx }

func (a *autoCommit) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return commitRow{a.Tx.QueryRow(ctx, sql, args...), a.Tx, ctx}
}

type commitRow struct {
	pgx.Row
	tx  pgx.Tx
	ctx context.Context
}

func (c commitRow) Scan(dest ...any) error {
	if err := c.Row.Scan(dest...); err != nil {
		return err
	}
	return c.tx.Commit(c.ctx)
}

func crashWorker(raw string) int {
	var cfg crashConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	h, _, err := crashServer(context.Background(), cfg, true)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println(ln.Addr().String())
	_ = http.Serve(ln, h)
	return 1
}

// TestServerKilledMidHandler SIGKILLs a server process after its handler
// charged and before it answered, then retries with the same key against a
// fresh server. Claim mode: the charge committed on its own, the key's
// lease lapses and the retry runs the handler again: 2 charges, as
// documented. Transactional mode: the charge died with the transaction, the
// retry runs it once: 1 charge.
func TestServerKilledMidHandler(t *testing.T) {
	for _, tc := range []struct {
		name string
		tx   bool
		want int
	}{{"claim", false, 2}, {"tx", true, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			pool := testenv.Postgres(t)
			cfg := crashConfig{
				DSN:     testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN),
				Charges: chargesTable(t, pool),
				Tx:      tc.tx,
				Lease:   time.Second,
			}
			cfg.Records = recordsTable(t, pool)
			raw, _ := json.Marshal(cfg)
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), crashEnv+"="+string(raw))
			cmd.Stderr = os.Stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			lines := bufio.NewScanner(out)
			if !lines.Scan() {
				t.Fatal("worker printed no address")
			}
			addr := lines.Text()
			key := newKey()
			go func() {
				_, _ = post(t, &http.Client{Timeout: 30 * time.Second}, "http://"+addr+"/payments", key, order)
			}()
			if !lines.Scan() || lines.Text() != "charged" {
				t.Fatalf("worker did not charge: %q", lines.Text())
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()

			h, hpool, err := crashServer(context.Background(), cfg, false)
			if err != nil {
				t.Fatal(err)
			}
			defer hpool.Close()
			srv := serve(t, h)
			var got answer
			inflight := 0
			deadline := time.Now().Add(20 * time.Second)
			for time.Now().Before(deadline) {
				got = mustPost(t, srv.URL+"/payments", key, order)
				if got.status != http.StatusConflict {
					break
				}
				inflight++
				time.Sleep(200 * time.Millisecond)
			}
			if got.status != http.StatusCreated {
				t.Fatalf("retry after the crash: %d %q", got.status, got.body)
			}
			charges := countRows(t, pool, cfg.Charges)
			t.Logf("%s mode: %d charge(s) after a SIGKILL mid-handler; the retry got %d 409s before the lease lapsed, then %s",
				tc.name, charges, inflight, got.body)
			if charges != tc.want {
				t.Errorf("%d charges, want %d", charges, tc.want)
			}
			if again := mustPost(t, srv.URL+"/payments", key, order); !again.replayed() || again.body != got.body {
				t.Errorf("later retry: %q, want the replay of %q", again.body, got.body)
			}
		})
	}
}
