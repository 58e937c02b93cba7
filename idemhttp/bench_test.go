package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/idemhttp"
	"github.com/dedupkit/dedup/internal/testenv"
)

// benchClients is the number of concurrent client goroutines of the load
// generator.
const benchClients = 32

// BenchmarkIdempotency measures requests per second and latency (p50, p99)
// through a real server on loopback, for a bare handler and for the
// middleware on each store, with new keys and with replays, side by side in
// one run. RT/req is the store round trips per request: PostgreSQL
// statements (begin and commit included), DynamoDB HTTP requests, memory
// store calls.
//
//	go test -run '^$' -bench BenchmarkIdempotency -benchtime 3000x ./idemhttp
func BenchmarkIdempotency(b *testing.B) {
	quiet := idemhttp.WithLogger(slog.New(slog.DiscardHandler))
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"ch_1","amount":4200,"currency":"EUR"}`)
	})
	claimMode := func(b *testing.B, store dedup.Store, opts ...idemhttp.Opt) http.Handler {
		m, err := idemhttp.New(store, append([]idemhttp.Opt{idemhttp.WithScope("bench"), quiet}, opts...)...)
		if err != nil {
			b.Fatal(err)
		}
		return m.Wrap(hello)
	}
	b.Run("bare", func(b *testing.B) { runLoad(b, hello, false, nil) })
	for _, replay := range []bool{false, true} {
		kind := map[bool]string{false: "new", true: "replay"}[replay]
		b.Run("memory/"+kind, func(b *testing.B) {
			var calls atomic.Int64
			runLoad(b, claimMode(b, countingStore{dedup.NewMemoryStore(), &calls}), replay, &calls)
		})
		b.Run("postgres-claim/"+kind, func(b *testing.B) {
			store, _, stmts := benchPostgres(b)
			runLoad(b, claimMode(b, store), replay, stmts)
		})
		b.Run("postgres-tx/"+kind, func(b *testing.B) {
			store, pool, stmts := benchPostgres(b)
			m, err := idemhttp.NewTx(store, pool, idemhttp.WithScope("bench"), quiet)
			if err != nil {
				b.Fatal(err)
			}
			runLoad(b, m.Wrap(func(w http.ResponseWriter, r *http.Request, _ pgx.Tx) { hello(w, r) }), replay, stmts)
		})
		b.Run("dynamodb/"+kind, func(b *testing.B) {
			store, requests := benchDynamoDB(b)
			runLoad(b, claimMode(b, store), replay, requests)
		})
		b.Run("redis/"+kind, func(b *testing.B) {
			store, commands := benchRedis(b)
			runLoad(b, claimMode(b, store), replay, commands)
		})
	}
	// A replay that misses the replay cache (another instance answered
	// first) costs what these rows cost: each a store read.
	b.Run("memory/replay-nocache", func(b *testing.B) {
		var calls atomic.Int64
		runLoad(b, claimMode(b, countingStore{dedup.NewMemoryStore(), &calls}, idemhttp.WithReplayCache(0)), true, &calls)
	})
	b.Run("redis/replay-nocache", func(b *testing.B) {
		store, commands := benchRedis(b)
		runLoad(b, claimMode(b, store, idemhttp.WithReplayCache(0)), true, commands)
	})
}

// replays is how many times each key is replayed in a replay run: retries
// are spread over many keys, as after a network blip.
const replays = 5

// runLoad serves h on loopback and sends b.N POSTs from benchClients
// goroutines over kept-alive connections. With replay, every key was
// answered once before the clock starts.
func runLoad(b *testing.B, h http.Handler, replay bool, roundTrips *atomic.Int64) {
	srv := serve(&testing.T{}, h)
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchClients}}
	defer client.CloseIdleConnections()
	keys := make([]string, b.N)
	for i := range keys {
		keys[i] = strconv.Quote(newKey())
	}
	send := func(key string) error {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(order))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("status %d", resp.StatusCode)
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
	if roundTrips != nil {
		roundTrips.Store(0)
	}
	b.ResetTimer()
	start := time.Now()
	for c := range benchClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
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
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) == 0 {
		return
	}
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
	if roundTrips != nil {
		b.ReportMetric(float64(roundTrips.Load())/float64(len(all)), "RT/req")
	}
	b.ReportMetric(0, "ns/op")
}

// countingStore counts the calls made to a store.
type countingStore struct {
	dedup.Store
	n *atomic.Int64
}

func (s countingStore) Claim(ctx context.Context, req dedup.ClaimRequest) (dedup.Claim, error) {
	s.n.Add(1)
	return s.Store.Claim(ctx, req)
}

func (s countingStore) Complete(ctx context.Context, key dedup.Key, owner string, result []byte, ttl time.Duration) error {
	s.n.Add(1)
	return s.Store.Complete(ctx, key, owner, result, ttl)
}

func (s countingStore) Fail(ctx context.Context, key dedup.Key, owner string, f dedup.Failure) error {
	s.n.Add(1)
	return s.Store.Fail(ctx, key, owner, f)
}

func (s countingStore) Extend(ctx context.Context, key dedup.Key, owner string, lease time.Duration) error {
	s.n.Add(1)
	return s.Store.Extend(ctx, key, owner, lease)
}

// statementCounter is a pgx tracer counting statements and batches sent.
type statementCounter struct{ n atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart counts a batch, sent in one round trip, as one: the
// transactional mode's claim is one (the claim and its savepoint).
func (c *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *statementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func benchPostgres(tb testing.TB) (*dedup.PostgresStore, *pgxpool.Pool, *atomic.Int64) {
	setup := testenv.Postgres(tb)
	cfg := setup.Config()
	counter := &statementCounter{}
	cfg.ConnConfig.Tracer = counter
	cfg.MaxConns = 2 * benchClients
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	store, err := dedup.NewPostgresStore(pool, dedup.WithTable(recordsTable(tb, setup)))
	if err != nil {
		tb.Fatal(err)
	}
	return store, pool, &counter.n
}

// countingDoer counts the HTTP requests of the DynamoDB client.
type countingDoer struct {
	base interface {
		Do(*http.Request) (*http.Response, error)
	}
	n atomic.Int64
}

func (c *countingDoer) Do(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.base.Do(r)
}

func benchDynamoDB(b *testing.B) (dedup.Store, *atomic.Int64) {
	base := testenv.DynamoDB(b)
	table := uniqueName("idemhttp-bench-")
	if err := dedup.CreateDynamoDBTable(context.Background(), base, dedup.WithTable(table)); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _, _ = base.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: &table}) })
	doer := &countingDoer{base: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * benchClients}}}
	client := dynamodb.New(base.Options(), func(o *dynamodb.Options) { o.HTTPClient = doer })
	store, err := dedup.NewDynamoDBStore(client, dedup.WithTable(table))
	if err != nil {
		b.Fatal(err)
	}
	return store, &doer.n
}

// BenchmarkMiddlewareCPU measures the middleware's own cost in process, with
// no network: a bare handler, then new keys and replays on the memory store.
func BenchmarkMiddlewareCPU(b *testing.B) {
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"ch_1","amount":4200,"currency":"EUR"}`)
	})
	m, err := idemhttp.New(dedup.NewMemoryStore(), idemhttp.WithScope("bench"), idemhttp.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		h    http.Handler
		key  func(i int) string
	}{
		{"bare", hello, func(int) string { return `"` + "8e03978e-40d5-43e8-bc93-6894a57f9324" + `"` }},
		{"memory/new", m.Wrap(hello), nil},
		{"memory/replay", m.Wrap(hello), func(int) string { return `"` + "8e03978e-40d5-43e8-bc93-6894a57f9324" + `"` }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			keys := make([]string, b.N)
			for i := range keys {
				if tc.key != nil {
					keys[i] = tc.key(i)
				} else {
					keys[i] = strconv.Quote(newKey())
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				// A context of its own, cancelled when the request ends, as
				// net/http gives each request.
				ctx, cancel := context.WithCancel(context.Background())
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "/payments", strings.NewReader(order))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", keys[i])
				tc.h.ServeHTTP(httptest.NewRecorder(), req)
				cancel()
			}
		})
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

func benchRedis(b *testing.B) (dedup.Store, *atomic.Int64) {
	store, client := redisStore(b)
	hook := &roundTripHook{}
	client.AddHook(hook)
	return store, &hook.n
}
