// Command payments-api is a payment endpoint made safe against retried
// requests with the Idempotency-Key middleware: POST /payments charges a
// (fake) card gateway once per key, however often the client retries.
//
//	go run ./examples/payments-api                 # serve on 127.0.0.1:8080, memory store
//	go run ./examples/payments-api -demo           # retry, replay and misuse, then exit
//	go run ./examples/payments-api -postgres "$DEDUP_POSTGRES_DSN"   # transactional mode
//
// With -postgres (or DEDUP_POSTGRES_DSN) the handler runs in the transaction
// holding the key: the payment row and the stored answer commit together.
// Callers authenticate with HTTP Basic auth (alice:alice-secret or
// bob:bob-secret) and each has keys of their own. -demo exits 0 only when
// the gateway was charged exactly once per key and caller.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/idemhttp"
)

// gateway is a fake card processor: every call is a real charge.
type gateway struct {
	mu      sync.Mutex
	charges []int64
}

func (g *gateway) charge(amount int64) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.charges = append(g.charges, amount)
	return "ch_" + rand.Text()[:16]
}

func (g *gateway) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.charges)
}

type paymentRequest struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// decode reads a payment request, answering 400 itself when it is bad.
func decode(w http.ResponseWriter, r *http.Request) (paymentRequest, bool) {
	var p paymentRequest
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.Amount <= 0 || len(p.Currency) != 3 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":"amount must be positive and currency a 3-letter code"}`)
		return p, false
	}
	return p, true
}

func created(w http.ResponseWriter, id string, p paymentRequest) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/"+id)
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(map[string]any{"id": id, "amount": p.Amount, "currency": p.Currency,
		"created": time.Now().UTC().Format(time.RFC3339Nano)})
}

// demoAccounts are the callers the API knows, by name and password; a real
// service asks its own authentication instead.
func demoAccounts() map[string]string {
	return map[string]string{"alice": "alice-secret", "bob": "bob-secret"}
}

// handler builds the API: the memory store in claim mode, or PostgreSQL in
// transactional mode when pool is set.
func handler(ctx context.Context, gw *gateway, pool *pgxpool.Pool) (http.Handler, error) {
	accounts := demoAccounts()
	opts := []idemhttp.Opt{
		idemhttp.WithScope("payments-api"),
		// Keys are bound to the authenticated caller: bob sending alice's
		// key makes a payment of his own, never a replay of hers.
		idemhttp.WithTenant(func(r *http.Request) (string, error) {
			user, password, ok := r.BasicAuth()
			if !ok || accounts[user] != password || password == "" {
				return "", errors.New("authenticate with HTTP Basic auth, e.g. alice:alice-secret")
			}
			return user, nil
		}),
	}
	mux := http.NewServeMux()
	if pool == nil {
		m, err := idemhttp.New(dedup.NewMemoryStore(), opts...)
		if err != nil {
			return nil, err
		}
		mux.Handle("POST /payments", m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if p, ok := decode(w, r); ok {
				created(w, gw.charge(p.Amount), p)
			}
		})))
		return mux, nil
	}
	store, err := dedup.NewPostgresStore(pool)
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS payments (
	id text PRIMARY KEY, amount bigint NOT NULL, currency text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, err
	}
	m, err := idemhttp.NewTx(store, pool, opts...)
	if err != nil {
		return nil, err
	}
	mux.Handle("POST /payments", m.Wrap(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) {
		p, ok := decode(w, r)
		if !ok {
			return
		}
		// The gateway is outside the transaction: a real one takes the same
		// Idempotency-Key, so a crash before commit cannot charge twice.
		id := gw.charge(p.Amount)
		if _, err := tx.Exec(r.Context(), `INSERT INTO payments (id, amount, currency) VALUES ($1, $2, $3)`, id, p.Amount, p.Currency); err != nil {
			http.Error(w, "storage unavailable", http.StatusServiceUnavailable)
			return
		}
		created(w, id, p)
	}))
	return mux, nil
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to serve on")
	demo := flag.Bool("demo", false, "run a retry, a replay and a key misuse against the API, then exit")
	dsn := flag.String("postgres", os.Getenv("DEDUP_POSTGRES_DSN"), "PostgreSQL DSN: transactional mode (default: memory store)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	var pool *pgxpool.Pool
	if *dsn != "" {
		var err error
		if pool, err = pgxpool.New(ctx, *dsn); err != nil {
			log.Fatal(err)
		}
		defer pool.Close()
	}
	gw := &gateway{}
	h, err := handler(ctx, gw, pool)
	if err != nil {
		log.Fatal(err)
	}
	listen := *addr
	if *demo {
		listen = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Shutdown(context.Background())
	mode := "memory store, claim mode"
	if pool != nil {
		mode = "PostgreSQL, transactional mode"
	}
	if !*demo {
		slog.Info("payments-api listening", "addr", ln.Addr().String(), "mode", mode)
		<-ctx.Done()
		return
	}
	fmt.Printf("payments-api on %s (%s)\n", ln.Addr(), mode)
	if err := runDemo("http://"+ln.Addr().String(), gw); err != nil {
		fmt.Println("FAIL:", err)
		os.Exit(1)
	}
	fmt.Println("OK: one charge per key and caller")
}

// losingTransport loses the first response after the server answered it.
type losingTransport struct{ lost bool }

func (l *losingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil && !l.lost {
		l.lost = true
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return nil, errors.New("connection reset (the answer was lost)")
	}
	return resp, err
}

func runDemo(url string, gw *gateway) error {
	key := `"` + rand.Text() + `"`
	accounts := demoAccounts()
	user := "alice"
	send := func(c *http.Client, key, body string) (int, string, error) {
		req, _ := http.NewRequest(http.MethodPost, url+"/payments", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		if user != "" {
			req.SetBasicAuth(user, accounts[user])
		}
		resp, err := c.Do(req)
		if err != nil {
			fmt.Printf("  -> %v\n", err)
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Printf("  -> %d %s=%q %s\n", resp.StatusCode, idemhttp.ReplayHeader, resp.Header.Get(idemhttp.ReplayHeader), strings.TrimSpace(string(b)))
		return resp.StatusCode, string(b), nil
	}
	order := `{"amount": 4200, "currency": "EUR"}`
	fmt.Printf("1. alice: POST /payments with Idempotency-Key %s; the answer is lost on the way back, the client retries\n", key)
	lossy := &http.Client{Transport: &losingTransport{}}
	var status int
	var body string
	var err error
	for try := 1; try <= 3; try++ {
		if status, body, err = send(lossy, key, order); err == nil {
			break
		}
	}
	if status != http.StatusCreated {
		return fmt.Errorf("the retry got %d, want 201", status)
	}
	fmt.Println("2. the same request again, keys reordered: replayed")
	if s, b, _ := send(http.DefaultClient, key, `{"currency":"EUR","amount":4200}`); s != http.StatusCreated || b != body {
		return fmt.Errorf("the replay got %d %q, want the first answer", s, b)
	}
	fmt.Println("3. the same key for another amount: refused, nothing charged")
	if s, _, _ := send(http.DefaultClient, key, `{"amount": 9900, "currency": "EUR"}`); s != http.StatusUnprocessableEntity {
		return fmt.Errorf("the reused key got %d, want 422", s)
	}
	fmt.Println("4. no key: refused")
	if s, _, _ := send(http.DefaultClient, "", order); s != http.StatusBadRequest {
		return fmt.Errorf("no key got %d, want 400", s)
	}
	fmt.Println("5. bob sends alice's key and order: a payment of his own, not her answer")
	user = "bob"
	if s, b, _ := send(http.DefaultClient, key, order); s != http.StatusCreated || b == body {
		return fmt.Errorf("bob got %d %q, want a new payment", s, b)
	}
	fmt.Println("6. no credentials: refused")
	user = ""
	if s, _, _ := send(http.DefaultClient, key, order); s != http.StatusForbidden {
		return fmt.Errorf("no caller got %d, want 403", s)
	}
	fmt.Printf("gateway charges: %d\n", gw.count())
	if gw.count() != 2 {
		return fmt.Errorf("%d charges, want 2 (one each for alice and bob)", gw.count())
	}
	return nil
}
