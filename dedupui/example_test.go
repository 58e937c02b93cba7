package dedupui_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/dedupui"
)

// The console mounted under /dedup/ of a service's mux, read-only, on a
// store holding one dead-lettered event. (A service mounts it behind its
// own authentication, with WithOutbox for its outbox.)
func Example() {
	ctx := context.Background()
	store := dedup.NewMemoryStore()
	key := dedup.Key{Scope: "orders", EventID: "order-17"}
	c, _ := store.Claim(ctx, dedup.ClaimRequest{Key: key, Fingerprint: "f", Lease: time.Minute, TTL: time.Hour})
	_ = store.Fail(ctx, key, c.Record.Owner, dedup.Failure{Final: true, Error: "card declined", TTL: time.Hour})

	mux := http.NewServeMux()
	mux.Handle("/dedup/", http.StripPrefix("/dedup", dedupui.New(store)))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/dedup/failed")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.Status)
	fmt.Println("lists orders/order-17:", strings.Contains(string(page), `data-scope="orders" data-id="order-17"`))
	fmt.Println("offers an action:", strings.Contains(string(page), "Release…"))
	// Output:
	// 200 OK
	// lists orders/order-17: true
	// offers an action: false
}
