// Package gofiber sets idemhttp beside Fiber's idempotency middleware
// (github.com/gofiber/fiber/v3/middleware/idempotency), each on its own
// server type and on a memory and a Redis store, measured in one run by one
// net/http load generator. It is a module of its own so that Fiber is never
// a dependency of dedup. README.md says how the comparison is kept fair and
// what each middleware does differently.
//
//	cd bench/gofiber && go test -run '^$' -bench SideBySide -benchtime 15000x -count 3
package gofiber_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/idempotency"
	fiberredis "github.com/gofiber/storage/redis/v3"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/idemhttp"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/redisstore"
)

// benchClients is the number of concurrent client goroutines of the load
// generator, as in idemhttp's BenchmarkIdempotency.
const benchClients = 32

// replays is how many times each key is sent in a replay run, as in
// idemhttp's BenchmarkIdempotency.
const replays = 5

// order is the request body every request sends.
const order = `{"amount": 4200, "currency": "EUR"}`

// answer is the body every handler answers with, status 201.
const answer = `{"id":"ch_1","amount":4200,"currency":"EUR"}`

// keyHeader is the header both middlewares read the key from.
const keyHeader = "Idempotency-Key"

// hello is the net/http handler: it reads the body and answers 201 with
// answer.
var hello = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, answer)
})

// fiberHello is hello on Fiber: fasthttp has read the body before the
// handler runs; the handler touches it all the same.
func fiberHello(c fiber.Ctx) error {
	_ = c.Body()
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Status(fiber.StatusCreated).SendString(answer)
}

// target is a server under load: its URL, how a key is written in the
// header, what to count as a store round trip, and what to remove after.
type target struct {
	url        string
	quote      bool          // send the key as a Structured Field string ("…")
	roundTrips *atomic.Int64 // nil: not counted
	forget     func(keys []string)
}

// BenchmarkSideBySide measures requests per second, latency (p50, p99) and
// process allocations per request (server and load generator together) for
// a bare handler and for each middleware on each store, new keys and
// replays, on net/http (idemhttp) and on Fiber (its idempotency middleware),
// in one run. x-bare is req/s over that of the bare handler on the same
// server type, loaded with as many requests just before the row (untimed),
// so that the machine's drift over the run falls alike on both; RT/req is
// Redis round trips per request.
//
//	go test -run '^$' -bench SideBySide -benchtime 15000x -count 3
func BenchmarkSideBySide(b *testing.B) {
	bare := map[string]func(b *testing.B) target{
		"nethttp": func(b *testing.B) target { return target{url: serveNetHTTP(b, hello)} },
		"fiber":   func(b *testing.B) target { return target{url: serveFiber(b, nil)} },
	}
	row := func(server, name string, setup func(b *testing.B) target, replay bool) {
		b.Run(server+"/"+name, func(b *testing.B) {
			before := runLoad(b, bare[server](b), false, false)
			rps := runLoad(b, setup(b), replay, true)
			if before > 0 && rps > 0 {
				b.ReportMetric(rps/before, "x-bare")
			}
		})
	}
	for _, server := range []string{"nethttp", "fiber"} {
		b.Run(server+"/bare", func(b *testing.B) { runLoad(b, bare[server](b), false, true) })
	}
	// Each row beside its counterpart on the other server type.
	for _, replay := range []bool{false, true} {
		kind := map[bool]string{false: "new", true: "replay"}[replay]
		row("nethttp", "idemhttp-memory/"+kind, func(b *testing.B) target {
			return target{url: serveNetHTTP(b, idem(b, dedup.NewMemoryStore())), quote: true}
		}, replay)
		row("fiber", "idempotency-memory/"+kind, func(b *testing.B) target {
			return target{url: serveFiber(b, fiberIdem(nil))}
		}, replay)
		row("nethttp", "idemhttp-redis/"+kind, func(b *testing.B) target {
			store, client := ourRedis(b)
			return target{url: serveNetHTTP(b, idem(b, store)), quote: true, roundTrips: countRoundTrips(client)}
		}, replay)
		row("fiber", "idempotency-redis/"+kind, func(b *testing.B) target {
			client := testenv.Redis(b)
			return target{
				url:        serveFiber(b, fiberIdem(fiberredis.NewFromConnection(client))),
				roundTrips: countRoundTrips(client),
				forget:     func(keys []string) { forgetFiberKeys(b, client, keys) },
			}
		}, replay)
	}
}

// idem is idemhttp over store, wrapping h (hello if nil).
func idem(tb testing.TB, store dedup.Store, h ...http.Handler) http.Handler {
	m, err := idemhttp.New(store, idemhttp.WithScope("bench"), idemhttp.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		tb.Fatal(err)
	}
	if len(h) == 0 {
		return m.Wrap(hello)
	}
	return m.Wrap(h[0])
}

// fiberIdem is Fiber's idempotency middleware reading keyHeader, over
// storage (nil: its own in-memory storage), with its in-process lock.
func fiberIdem(storage fiber.Storage) fiber.Handler {
	return idempotency.New(idempotency.Config{KeyHeader: keyHeader, Storage: storage})
}

// serveNetHTTP starts a real http.Server on loopback with h and returns its
// URL.
func serveNetHTTP(tb testing.TB, h http.Handler) string {
	srv := httptest.NewServer(h)
	tb.Cleanup(srv.Close)
	return srv.URL
}

// serveFiber starts a Fiber app (fasthttp) on loopback with middleware (if
// any) in front of handler (fiberHello if nil) on POST /payments, and
// returns its URL.
func serveFiber(tb testing.TB, middleware fiber.Handler, handler ...fiber.Handler) string {
	app := fiber.New()
	if middleware != nil {
		app.Use(middleware)
	}
	if len(handler) == 0 {
		handler = []fiber.Handler{fiberHello}
	}
	app.Post("/payments", handler[0])
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- app.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true}) }()
	tb.Cleanup(func() {
		if err := app.Shutdown(); err != nil {
			tb.Error(err)
		}
		if err := <-done; err != nil {
			tb.Error(err)
		}
	})
	return "http://" + ln.Addr().String()
}

// ourRedis is a redisstore.Store under a key prefix of its own, its keys
// removed when tb ends, and its client.
func ourRedis(tb testing.TB) (*redisstore.Store, *redis.Client) {
	client := testenv.Redis(tb)
	prefix := "gofiber-bench-" + uuid.NewString() + ":"
	forgetPrefix(tb, client, prefix)
	store, err := redisstore.New(client, redisstore.WithKeyPrefix(prefix))
	if err != nil {
		tb.Fatal(err)
	}
	return store, client
}

// forgetPrefix removes the Redis keys under prefix when tb ends.
func forgetPrefix(tb testing.TB, client *redis.Client, prefix string) {
	tb.Cleanup(func() {
		ctx := context.Background()
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			client.Del(ctx, iter.Val())
		}
	})
}

// forgetFiberKeys removes the keys Fiber's Redis storage wrote: it stores
// each response under the bare idempotency key.
func forgetFiberKeys(tb testing.TB, client *redis.Client, keys []string) {
	ctx := context.Background()
	for chunk := range slices.Chunk(keys, 1000) {
		if err := client.Del(ctx, chunk...).Err(); err != nil {
			tb.Error(err)
		}
	}
}

// roundTripHook counts the round trips of a go-redis client.
type roundTripHook struct{ n atomic.Int64 }

func (h *roundTripHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *roundTripHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *roundTripHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// countRoundTrips hooks client and returns its round-trip count.
func countRoundTrips(client *redis.Client) *atomic.Int64 {
	hook := &roundTripHook{}
	client.AddHook(hook)
	return &hook.n
}

// post sends one POST /payments with order and key (no header if key is
// empty) and returns the status and body.
func post(client *http.Client, url, key string) (int, string, error) {
	req, err := http.NewRequest(http.MethodPost, url+"/payments", strings.NewReader(order))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(keyHeader, key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// runLoad sends b.N POSTs to t from benchClients goroutines over kept-alive
// connections and returns the requests per second. With replay, every key
// was answered once before the clock starts and is sent replays times.
// Timed, it resets b's timer and reports the row's metrics; else it reports
// nothing.
func runLoad(b *testing.B, t target, replay, timed bool) float64 {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchClients}}
	defer client.CloseIdleConnections()
	keys := make([]string, b.N)
	for i := range keys {
		keys[i] = uuid.NewString() // 36 characters, as Fiber's default validator requires
	}
	if t.forget != nil {
		defer t.forget(keys)
	}
	send := func(key string) error {
		if t.quote {
			key = strconv.Quote(key)
		}
		status, body, err := post(client, t.url, key)
		if err != nil {
			return err
		}
		if status != http.StatusCreated || body != answer {
			return fmt.Errorf("status %d, body %q", status, body)
		}
		return nil
	}
	if replay {
		for i := 0; i < len(keys); i += replays { // each key answered once, then replayed
			if err := send(keys[i]); err != nil {
				b.Fatal(err)
			}
		}
	}
	var next atomic.Int64
	lat := make([][]time.Duration, benchClients)
	var wg sync.WaitGroup
	if t.roundTrips != nil {
		t.roundTrips.Store(0)
	}
	if timed {
		b.ReportAllocs()
		b.ResetTimer()
	}
	start := time.Now()
	for c := range benchClients {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				key := keys[i]
				if replay {
					key = keys[i-i%replays]
				}
				t0 := time.Now()
				if err := send(key); err != nil {
					b.Error(err)
					return
				}
				lat[c] = append(lat[c], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	all := slices.Concat(lat...)
	rps := float64(len(all)) / elapsed.Seconds()
	if !timed || len(all) == 0 {
		return rps
	}
	b.StopTimer()
	slices.Sort(all)
	b.ReportMetric(rps, "req/s")
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
	if t.roundTrips != nil {
		b.ReportMetric(float64(t.roundTrips.Load())/float64(len(all)), "RT/req")
	}
	b.ReportMetric(0, "ns/op")
	return rps
}
