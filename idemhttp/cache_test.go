package idemhttp_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/idemhttp"
	"github.com/dedupkit/dedup/internal/testenv"
)

// countedStore is a store whose calls (memory) or round trips (Redis) the
// replay cache tests count.
type countedStore struct {
	name string
	open func(t *testing.T) (dedup.Store, *atomic.Int64)
}

var countedStores = []countedStore{
	{"memory", func(*testing.T) (dedup.Store, *atomic.Int64) {
		calls := new(atomic.Int64)
		return countingStore{dedup.NewMemoryStore(), calls}, calls
	}},
	{"redis", func(t *testing.T) (dedup.Store, *atomic.Int64) {
		store, client := redisStore(t)
		hook := &roundTripHook{}
		client.AddHook(hook)
		return store, &hook.n
	}},
}

// testClock is the replay cache's clock in these tests: it stands still
// until the test moves it.
type testClock struct{ ns atomic.Int64 }

func newTestClock() *testClock {
	c := &testClock{}
	c.ns.Store(time.Now().UnixNano())
	return c
}

func (c *testClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *testClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// A replay after the first answer is answered from the cache, with no
// store call: the same request replayed, another refused with the problem
// the store path answers.
func TestReplayCacheAnswersWithoutTheStore(t *testing.T) {
	for _, sc := range countedStores {
		t.Run(sc.name, func(t *testing.T) {
			store, calls := sc.open(t)
			pay := &payments{}
			srv := serve(t, newMiddleware(t, store).Wrap(pay))
			key := newKey()
			first := mustPost(t, srv.URL, key, order)
			if first.status != http.StatusCreated || first.replayed() {
				t.Fatalf("first answer %d %q", first.status, first.body)
			}
			calls.Store(0)
			for range 5 {
				if a := mustPost(t, srv.URL, key, `{"currency":"EUR","amount":4200}`); a.status != http.StatusCreated || !a.replayed() || a.body != first.body ||
					a.header.Get("Location") != first.header.Get("Location") {
					t.Fatalf("replay %d %v %q, want %q", a.status, a.header, a.body, first.body)
				}
			}
			changed := mustPost(t, srv.URL, key, `{"amount": 9900, "currency": "EUR"}`)
			if n := calls.Load(); n != 0 {
				t.Errorf("%d store calls for five replays and a changed body, want 0", n)
			}
			if pay.charges.Load() != 1 {
				t.Errorf("%d charges, want 1", pay.charges.Load())
			}

			// The store path's refusal, from an instance without a cache.
			uncached := serve(t, newMiddleware(t, store, idemhttp.WithReplayCache(0)).Wrap(pay))
			want := mustPost(t, uncached.URL, key, `{"amount": 9900, "currency": "EUR"}`)
			if calls.Load() == 0 {
				t.Error("the uncached instance made no store call")
			}
			if changed.status != http.StatusUnprocessableEntity || changed.problemType() != problem(idemhttp.ProblemKeyReused) ||
				changed.status != want.status || changed.body != want.body || changed.header.Get("Content-Type") != want.header.Get("Content-Type") {
				t.Errorf("changed body from the cache: %d %q, from the store: %d %q", changed.status, changed.body, want.status, want.body)
			}
		})
	}
}

// Tenants never share an entry: the same scope and key sent by another
// caller runs the handler for that caller, and each caller's retries
// replay their own answer from the cache.
func TestReplayCacheKeepsTenantsApart(t *testing.T) {
	for _, sc := range countedStores {
		t.Run(sc.name, func(t *testing.T) {
			store, calls := sc.open(t)
			pay := &payments{}
			m := newMiddleware(t, store, idemhttp.WithTenant(func(r *http.Request) (string, error) { return r.Header.Get("X-Caller"), nil }))
			srv := serve(t, m.Wrap(pay))
			key := newKey()
			send := func(caller string) answer {
				t.Helper()
				req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(order))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", strconv.Quote(key))
				req.Header.Set("X-Caller", caller)
				a, err := do(http.DefaultClient, req)
				if err != nil {
					t.Fatal(err)
				}
				return a
			}
			alice, bob := send("alice"), send("bob")
			if alice.replayed() || bob.replayed() || alice.body == bob.body || pay.charges.Load() != 2 {
				t.Fatalf("alice %q, bob %q (replayed %v, %v): want an answer each", alice.body, bob.body, alice.replayed(), bob.replayed())
			}
			calls.Store(0)
			for range 3 {
				if a := send("alice"); !a.replayed() || a.body != alice.body {
					t.Errorf("alice's retry: %q, want %q", a.body, alice.body)
				}
				if b := send("bob"); !b.replayed() || b.body != bob.body {
					t.Errorf("bob's retry: %q, want %q", b.body, bob.body)
				}
			}
			if n := calls.Load(); n != 0 {
				t.Errorf("%d store calls for the retries, want 0", n)
			}
			if _, entries := m.ReplayCacheStats(); entries != 2 {
				t.Errorf("%d entries, want one per caller", entries)
			}
		})
	}
}

// An entry never outlives its record: past the record's expiry the cache
// has nothing, and the store is asked.
func TestReplayCacheNeverOutlivesItsRecord(t *testing.T) {
	for _, sc := range countedStores {
		t.Run(sc.name, func(t *testing.T) {
			store, calls := sc.open(t)
			clock := newTestClock()
			srv := serve(t, newMiddleware(t, store, idemhttp.WithTTL(time.Hour), idemhttp.WithReplayCacheMaxAge(2*time.Hour),
				idemhttp.WithCacheClock(clock.Now)).Wrap(&payments{}))
			key := newKey()
			first := mustPost(t, srv.URL, key, order)
			calls.Store(0)
			clock.advance(59 * time.Minute)
			if a := mustPost(t, srv.URL, key, order); !a.replayed() || a.body != first.body || calls.Load() != 0 {
				t.Fatalf("before the record's expiry: %q after %d store calls, want %q from the cache", a.body, calls.Load(), first.body)
			}
			clock.advance(2 * time.Minute) // the cache's clock past the record's expiry; the store's is not
			for i := int64(1); i <= 2; i++ {
				if a := mustPost(t, srv.URL, key, order); !a.replayed() || a.body != first.body || calls.Load() != i {
					t.Fatalf("after the record's expiry, request %d: %q after %d store calls, want %q from the store", i, a.body, calls.Load(), first.body)
				}
			}
		})
	}
}

// storeWithDelete is a store on which an operator deletes every record by
// hand.
type storeWithDelete struct {
	name string
	open func(t *testing.T) (store dedup.Store, deleteAll func())
}

var storesWithDelete = []storeWithDelete{
	{"redis", func(t *testing.T) (dedup.Store, func()) {
		store, client, prefix := redisStorePrefix(t)
		return store, func() { deleteRedisKeys(t, client, prefix) }
	}},
	{"postgres", func(t *testing.T) (dedup.Store, func()) {
		pool := testenv.Postgres(t)
		table := recordsTable(t, pool)
		store, err := dedup.NewPostgresStore(pool, dedup.WithTable(table))
		if err != nil {
			t.Fatal(err)
		}
		return store, func() {
			if _, err := pool.Exec(context.Background(), "DELETE FROM "+pgx.Identifier{table}.Sanitize()); err != nil {
				t.Fatal(err)
			}
		}
	}},
}

func deleteRedisKeys(t *testing.T, client *redis.Client, prefix string) {
	t.Helper()
	ctx := context.Background()
	keys, err := client.Keys(ctx, prefix+"*").Result()
	if err == nil && len(keys) > 0 {
		err = client.Del(ctx, keys...).Err()
	}
	if err != nil || len(keys) == 0 {
		t.Fatalf("delete %d keys under %s: %v", len(keys), prefix, err)
	}
}

// Two instances on one store: a second instance's first replay reads the
// store, later ones its cache. A record deleted by hand is replayed by an
// instance that cached it until the max age passes, then the key runs
// afresh there.
func TestReplayCacheAcrossInstances(t *testing.T) {
	for _, sc := range storesWithDelete {
		t.Run(sc.name, func(t *testing.T) {
			store, deleteAll := sc.open(t)
			calls := new(atomic.Int64)
			counted := countingStore{store, calls}
			clock := newTestClock()
			pay := &payments{}
			a := serve(t, newMiddleware(t, counted, idemhttp.WithCacheClock(clock.Now)).Wrap(pay))
			b := serve(t, newMiddleware(t, counted, idemhttp.WithCacheClock(clock.Now)).Wrap(pay))
			key := newKey()
			first := mustPost(t, a.URL, key, order)
			calls.Store(0)
			if r := mustPost(t, b.URL, key, order); !r.replayed() || r.body != first.body || calls.Load() != 1 {
				t.Fatalf("second instance's first replay: %q after %d store calls, want %q from one", r.body, calls.Load(), first.body)
			}
			if r := mustPost(t, b.URL, key, order); !r.replayed() || r.body != first.body || calls.Load() != 1 {
				t.Fatalf("second instance's second replay: %q after %d store calls, want %q from its cache", r.body, calls.Load(), first.body)
			}

			deleteAll() // the operator deletes the record
			clock.advance(idemhttp.DefaultReplayCacheMaxAge - time.Second)
			if r := mustPost(t, b.URL, key, order); !r.replayed() || r.body != first.body || pay.charges.Load() != 1 {
				t.Fatalf("within the max age: %q (%d charges), want the cached %q", r.body, pay.charges.Load(), first.body)
			}
			clock.advance(time.Second)
			again := mustPost(t, b.URL, key, order)
			if again.status != http.StatusCreated || again.replayed() || again.body == first.body || pay.charges.Load() != 2 {
				t.Fatalf("after the max age: %d %q replayed=%v (%d charges), want the handler run again", again.status, again.body, again.replayed(), pay.charges.Load())
			}
			// The first instance's entry passed its max age too: it reads the
			// store and replays the new answer.
			if r := mustPost(t, a.URL, key, order); !r.replayed() || r.body != again.body {
				t.Errorf("first instance after the max age: %q, want the new answer %q", r.body, again.body)
			}
		})
	}
}

// dateField is the Date field of a response, which differs between two
// answers a second apart.
var dateField = regexp.MustCompile(`(?m)^Date: [^\r\n]*\r\n`)

// rawAnswer sends order with key over a connection of its own and
// returns the response as it came, less its Date field.
func rawAnswer(t *testing.T, srv *httptest.Server, key string) string {
	t.Helper()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Minute)) // against a hang only
	if _, err := io.WriteString(conn, rawPost("Idempotency-Key: "+strconv.Quote(key)+"\r\n", order)); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(conn)
	if err != nil {
		t.Fatal(err)
	}
	return dateField.ReplaceAllString(string(b), "")
}

// A cached replay is byte for byte the store's replay.
func TestCachedReplayIsByteIdentical(t *testing.T) {
	for _, sc := range countedStores {
		t.Run(sc.name, func(t *testing.T) {
			store, calls := sc.open(t)
			pay := &payments{}
			a := serve(t, newMiddleware(t, store).Wrap(pay))
			b := serve(t, newMiddleware(t, store, idemhttp.WithReplayCache(0)).Wrap(pay))
			key := newKey()
			mustPost(t, a.URL+"/payments", key, order)
			calls.Store(0)
			cached := rawAnswer(t, a, key)
			if calls.Load() != 0 {
				t.Fatalf("%d store calls for a cached replay", calls.Load())
			}
			stored := rawAnswer(t, b, key)
			if calls.Load() == 0 {
				t.Fatal("no store call for a store replay")
			}
			if !strings.Contains(cached, "\r\nIdempotent-Replayed: true\r\n") || cached != stored {
				t.Errorf("cached replay:\n%q\nstore replay:\n%q", cached, stored)
			}
		})
	}
}

// sized answers a body of the size its query asks for.
func sized(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.Atoi(r.URL.Query().Get("size"))
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(strings.Repeat("x", n)))
}

// The cache holds no more than its budget, dropping the least recently
// used answers, and an answer over an eighth of it is not cached.
func TestReplayCacheBudget(t *testing.T) {
	const budget = 64 << 10
	for _, sc := range countedStores {
		t.Run(sc.name, func(t *testing.T) {
			store, calls := sc.open(t)
			m := newMiddleware(t, store, idemhttp.WithReplayCache(budget))
			srv := serve(t, m.Wrap(http.HandlerFunc(sized)))
			post := func(key string, size int) answer {
				t.Helper()
				return mustPost(t, srv.URL+"?size="+strconv.Itoa(size), key, order)
			}
			keys := make([]string, 40)
			for i := range keys {
				keys[i] = newKey()
				if a := post(keys[i], 4<<10); a.status != http.StatusOK || len(a.body) != 4<<10 {
					t.Fatalf("answer %d: %d, %d bytes", i, a.status, len(a.body))
				}
				if used, _ := m.ReplayCacheStats(); used > budget {
					t.Fatalf("after %d answers of 4 KiB: %d bytes held, over the budget of %d", i+1, used, budget)
				}
			}
			used, entries := m.ReplayCacheStats()
			if entries < 10 || entries >= 16 || used < entries*(4<<10) {
				t.Errorf("%d entries in %d bytes: want 10 to 15 of 4 KiB each and their keys within %d bytes", entries, used, budget)
			}
			calls.Store(0)
			if a := post(keys[len(keys)-1], 4<<10); !a.replayed() || calls.Load() != 0 {
				t.Errorf("the latest answer: replayed=%v after %d store calls, want it from the cache", a.replayed(), calls.Load())
			}
			if a := post(keys[0], 4<<10); !a.replayed() || calls.Load() == 0 {
				t.Errorf("the first answer: replayed=%v after %d store calls, want it from the store (evicted)", a.replayed(), calls.Load())
			}

			large := newKey()
			post(large, budget/8+1)
			for range 2 {
				calls.Store(0)
				if a := post(large, budget/8+1); !a.replayed() || len(a.body) != budget/8+1 || calls.Load() == 0 {
					t.Errorf("an answer over an eighth of the budget: replayed=%v, %d bytes, %d store calls; want it from the store",
						a.replayed(), len(a.body), calls.Load())
				}
			}
			if used, _ := m.ReplayCacheStats(); used > budget {
				t.Errorf("%d bytes held, over the budget of %d", used, budget)
			}
		})
	}
}

// Fifty goroutines replaying and refusing the same and different keys at
// once: each key runs once and every retry gets its answer.
func TestReplayCacheConcurrent(t *testing.T) {
	for _, sc := range countedStores {
		t.Run(sc.name, func(t *testing.T) {
			store, _ := sc.open(t)
			pay := &payments{}
			m := newMiddleware(t, store, idemhttp.WithReplayCache(16<<10)) // small: evictions happen meanwhile
			srv := serve(t, m.Wrap(pay))
			keys := make([]string, 60)
			answers := make([]string, len(keys))
			for i := range keys {
				keys[i] = newKey()
				answers[i] = mustPost(t, srv.URL, keys[i], order).body
			}
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 50}}
			t.Cleanup(client.CloseIdleConnections)
			var wg sync.WaitGroup
			for g := range 50 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := range 20 {
						i := (g*7 + j*13) % len(keys)
						if j%4 == 0 {
							i = 0 // one key everyone sends
						}
						body, want := order, answers[i]
						if j%5 == 4 {
							body = `{"amount": 1}`
						}
						a, err := post(t, client, srv.URL, keys[i], body)
						switch {
						case err != nil:
							t.Error(err)
							return
						case body != order && (a.status != http.StatusUnprocessableEntity || a.problemType() != problem(idemhttp.ProblemKeyReused)):
							t.Errorf("changed body: %d %q", a.status, a.body)
						case body == order && (!a.replayed() || a.body != want):
							t.Errorf("replay of key %d: %d %q, want %q", i, a.status, a.body, want)
						}
					}
				}()
			}
			wg.Wait()
			if n := pay.charges.Load(); n != int64(len(keys)) {
				t.Errorf("%d charges, want one per key (%d)", n, len(keys))
			}
			if used, _ := m.ReplayCacheStats(); used > 16<<10 {
				t.Errorf("%d bytes held, over the budget", used)
			}
		})
	}
}

// In transactional mode a cached replay begins no transaction: no
// statement reaches the database.
func TestReplayCacheTx(t *testing.T) {
	store, pool, statements := benchPostgres(t)
	charges := chargesTable(t, pool)
	m, err := idemhttp.NewTx(store, pool, idemhttp.WithScope("payments-api"))
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, m.Wrap(txCharge(charges, nil)))
	key := newKey()
	first := mustPost(t, srv.URL, key, order)
	if first.status != http.StatusCreated {
		t.Fatalf("first answer %d %q", first.status, first.body)
	}
	statements.Store(0)
	for range 3 {
		if a := mustPost(t, srv.URL, key, order); !a.replayed() || a.body != first.body {
			t.Errorf("replay %d %q, want %q", a.status, a.body, first.body)
		}
	}
	if a := mustPost(t, srv.URL, key, `{"amount": 1}`); a.status != http.StatusUnprocessableEntity {
		t.Errorf("changed body: %d %q", a.status, a.body)
	}
	if n := statements.Load(); n != 0 {
		t.Errorf("%d statements for cached replays and a refusal, want 0", n)
	}
	if n := countRows(t, pool, charges); n != 1 {
		t.Errorf("%d charges, want 1", n)
	}
}
