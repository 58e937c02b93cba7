// Command console serves the operator's console (package dedupui) over a
// memory store seeded with records of every state, with nothing to
// install, so the pages can be seen and the actions tried:
//
//	go run ./examples/console
//	go run ./examples/console -addr 127.0.0.1:8081
//
// It serves until interrupted. A service mounts the same handler behind
// its own authentication, on its own store and outbox.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/dedupui"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to serve the console on")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *addr, func(url string) { fmt.Printf("dedup console on %s (interrupt to stop)\n", url) }); err != nil {
		fmt.Fprintln(os.Stderr, "console:", err)
		os.Exit(1)
	}
}

// run seeds a store and serves its console on addr until ctx ends,
// calling serving with the console's URL once it listens.
func run(ctx context.Context, addr string, serving func(url string)) error {
	store := dedup.NewMemoryStore()
	if err := seed(ctx, store); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/dedup/", http.StripPrefix("/dedup", dedupui.New(store, dedupui.WithActions(), dedupui.WithPayloads(),
		dedupui.WithCaller(func(r *http.Request) string { return "example user at " + r.RemoteAddr }),
		dedupui.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))))))
	mux.Handle("/{$}", http.RedirectHandler("/dedup/", http.StatusFound))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	serving("http://" + ln.Addr().String() + "/dedup/")
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// seed writes, through the store's own operations, orders of every state:
// succeeded with a result, in flight, stuck (a lapsed lease), failed
// retryably and failed for good, in two scopes.
func seed(ctx context.Context, store dedup.Store) error {
	reasons := []string{"card declined", "inventory service: connection refused", "invalid currency \"XYZ\""}
	for _, scope := range []string{"orders/charge", "orders/ship"} {
		for i := range 40 {
			key := dedup.Key{Scope: scope, EventID: fmt.Sprintf("order-%03d", i)}
			lease := time.Minute
			if i%10 == 3 {
				lease = time.Nanosecond // stuck at once: its worker "died"
			}
			c, err := store.Claim(ctx, dedup.ClaimRequest{Key: key, Fingerprint: fmt.Sprintf("%x", i), Lease: lease, TTL: 24 * time.Hour})
			if err != nil {
				return err
			}
			owner := c.Record.Owner
			switch i % 10 {
			case 0, 1, 2, 5, 6, 7:
				err = store.Complete(ctx, key, owner, []byte(fmt.Sprintf(`{"order":%d,"charged":true}`, i)), 24*time.Hour)
			case 8:
				err = store.Fail(ctx, key, owner, dedup.Failure{Error: reasons[i%len(reasons)], TTL: 24 * time.Hour})
			case 9:
				err = store.Fail(ctx, key, owner, dedup.Failure{Final: true, Error: reasons[(i/10)%len(reasons)], TTL: 24 * time.Hour})
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}
