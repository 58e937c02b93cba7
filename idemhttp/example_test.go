package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/idemhttp"
)

func ExampleNew() {
	charges := 0
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++ // the business effect
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%d"}`, charges)
	})
	m, err := idemhttp.New(dedup.NewMemoryStore(), idemhttp.WithScope("payments-api"))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", m.Wrap(charge))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	send := func(body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.StatusCode, resp.Header.Get(idemhttp.ReplayHeader), strings.SplitN(string(b), ",", 2)[0])
	}
	send(`{"amount": 4200}`)  // runs the handler
	send(`{ "amount":4200 }`) // the same request: replayed
	send(`{"amount": 9900}`)  // the key reused for another request
	fmt.Println("charges:", charges)
	// Output:
	// 201  {"id":"ch_1"}
	// 201 true {"id":"ch_1"}
	// 422  {"type":"urn:dedupkit:idempotency:key-reused"
	// charges: 1
}

// claimCounter counts the claims made of its store.
type claimCounter struct {
	dedup.Store
	claims int
}

func (c *claimCounter) Claim(ctx context.Context, req dedup.ClaimRequest) (dedup.Claim, error) {
	c.claims++
	return c.Store.Claim(ctx, req)
}

func ExampleWithReplayCache() {
	store := &claimCounter{Store: dedup.NewMemoryStore()}
	m, err := idemhttp.New(store, idemhttp.WithScope("payments-api"),
		idemhttp.WithReplayCache(32<<20),               // 32 MiB of settled answers (default 8 MiB; 0: off)
		idemhttp.WithReplayCacheMaxAge(10*time.Second), // a record deleted by hand is replayed 10 s at most
	)
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"ch_1"}`)
	})))
	defer srv.Close()

	for range 3 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount": 4200}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get(idemhttp.ReplayHeader), "claims:", store.claims)
	}
	// Output:
	// 201  claims: 1
	// 201 true claims: 1
	// 201 true claims: 1
}

func ExampleNewTx() {
	var pool *pgxpool.Pool // connected to the database of the store's table
	store, err := dedup.NewPostgresStore(pool)
	if err != nil {
		log.Fatal(err)
	}
	m, err := idemhttp.NewTx(store, pool, idemhttp.WithScope("payments-api"))
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("POST /payments", m.Wrap(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) {
		// The charge row commits with the stored answer, or neither does.
		var id int64
		if err := tx.QueryRow(r.Context(), "INSERT INTO charges (amount) VALUES (4200) RETURNING id").Scan(&id); err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable) // rolled back, the key stays retryable
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	}))
}
