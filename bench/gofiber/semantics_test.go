package gofiber_test

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v3"
	fiberredis "github.com/gofiber/storage/redis/v3"
	"github.com/google/uuid"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/testenv"
)

// The tests below check, on real servers, the claims README.md makes about
// how the two middlewares differ: each case runs on both, and states what
// each answers and how many times the handler ran.

// effects is a handler's behaviour and the count of its runs (its effects).
type effects struct {
	runs    atomic.Int64
	status  int           // answered status (201 if 0)
	entered chan struct{} // if not nil: signalled when a run starts, which then waits for release
	release chan struct{}
}

func (e *effects) run() int {
	e.runs.Add(1)
	if e.entered != nil {
		e.entered <- struct{}{}
		<-e.release
	}
	if e.status != 0 {
		return e.status
	}
	return http.StatusCreated
}

func (e *effects) netHTTP() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		status := e.run()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Set-Cookie", "session=secret")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, answer)
	})
}

func (e *effects) fiber(c fiber.Ctx) error {
	_ = c.Body()
	status := e.run()
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	c.Set(fiber.HeaderSetCookie, "session=secret")
	return c.Status(status).SendString(answer)
}

// side is one middleware on one store: start returns the URL of a new
// server instance; instances of one side share its store.
type side struct {
	name  string
	fiber bool
	start func(e *effects) string
}

// sides returns idemhttp and Fiber's middleware, each on memory and on Redis
// (the Redis sides' keys removed when t ends).
func sides(t *testing.T) []side {
	memory := dedup.NewMemoryStore()
	ourRedisStore, _ := ourRedis(t)
	fiberMemory := fiberIdem(nil) // one middleware: one storage and one lock for every instance
	client := testenv.Redis(t)
	prefix := "gofiber-test-" + uuid.NewString() + ":"
	forgetPrefix(t, client, prefix)
	storage := prefixed{fiberredis.NewFromConnection(client), prefix}
	return []side{
		{"idemhttp-memory", false, func(e *effects) string { return serveNetHTTP(t, idem(t, memory, e.netHTTP())) }},
		{"idemhttp-redis", false, func(e *effects) string { return serveNetHTTP(t, idem(t, ourRedisStore, e.netHTTP())) }},
		{"fiber-memory", true, func(e *effects) string { return serveFiber(t, fiberMemory, e.fiber) }},
		// Each instance has its own in-process lock, as idempotency.New
		// makes by default, over the shared Redis.
		{"fiber-redis", true, func(e *effects) string { return serveFiber(t, fiberIdem(storage), e.fiber) }},
	}
}

// prefixed puts prefix before every key of a Fiber storage, so that a
// test's keys can be found and removed (Fiber stores a response under the
// bare idempotency key).
type prefixed struct {
	*fiberredis.Storage
	prefix string
}

func (p prefixed) GetWithContext(ctx context.Context, key string) ([]byte, error) {
	return p.Storage.GetWithContext(ctx, p.prefix+key)
}

func (p prefixed) SetWithContext(ctx context.Context, key string, val []byte, exp time.Duration) error {
	return p.Storage.SetWithContext(ctx, p.prefix+key, val, exp)
}

// reply is one answer.
type reply struct {
	status int
	header http.Header
	body   string
}

// oneShot is the tests' client: a connection per request, so that no idle
// connection holds up a Fiber server's shutdown (fasthttp's Shutdown does not
// close keep-alive connections but waits for them to close; net/http's client
// keeps idle ones for 90 s).
var oneShot = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// send is one POST /payments with body and key (no header if empty), the
// key quoted for idemhttp as the IETF draft writes it.
func send(t *testing.T, s side, url, key, body string) reply {
	if key != "" && !s.fiber {
		key = strconv.Quote(key)
	}
	req, err := http.NewRequest(http.MethodPost, url+"/payments", strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return reply{}
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(keyHeader, key)
	}
	resp, err := oneShot.Do(req)
	if err != nil {
		t.Error(err)
		return reply{}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Error(err)
	}
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// pick is ours for idemhttp, fibers for Fiber.
func pick[T any](s side, ours, fibers T) T {
	if s.fiber {
		return fibers
	}
	return ours
}

// TestReplay: a new key runs the handler and a repeat replays its answer on
// both. idemhttp marks the replay (Idempotent-Replayed) and leaves
// Set-Cookie out; Fiber replays every header and marks nothing.
func TestReplay(t *testing.T) {
	for _, s := range sides(t) {
		t.Run(s.name, func(t *testing.T) {
			e := &effects{}
			url := s.start(e)
			key := uuid.NewString()
			first := send(t, s, url, key, order)
			again := send(t, s, url, key, order)
			for _, r := range []reply{first, again} {
				if r.status != http.StatusCreated || r.body != answer {
					t.Errorf("got %d %q, want 201 %q", r.status, r.body, answer)
				}
			}
			if n := e.runs.Load(); n != 1 {
				t.Errorf("handler ran %d times, want 1", n)
			}
			if got, want := again.header.Get("Idempotent-Replayed"), pick(s, "true", ""); got != want {
				t.Errorf("Idempotent-Replayed %q, want %q", got, want)
			}
			if got, want := again.header.Get("Set-Cookie"), pick(s, "", "session=secret"); got != want {
				t.Errorf("replayed Set-Cookie %q, want %q", got, want)
			}
		})
	}
}

// TestChangedBody: the same key with another body is refused by idemhttp
// (422 key-reused) and answered with the first body's response by Fiber,
// which does not look at the request.
func TestChangedBody(t *testing.T) {
	for _, s := range sides(t) {
		t.Run(s.name, func(t *testing.T) {
			e := &effects{}
			url := s.start(e)
			key := uuid.NewString()
			send(t, s, url, key, order)
			r := send(t, s, url, key, `{"amount": 9900, "currency": "EUR"}`)
			if want := pick(s, http.StatusUnprocessableEntity, http.StatusCreated); r.status != want {
				t.Errorf("changed body: status %d, want %d", r.status, want)
			}
			if s.fiber && r.body != answer {
				t.Errorf("changed body: %q, want the first answer %q", r.body, answer)
			}
			if n := e.runs.Load(); n != 1 {
				t.Errorf("handler ran %d times, want 1", n)
			}
		})
	}
}

// TestServerError: a 500 leaves the key retryable on idemhttp (the retry
// runs the handler again); Fiber stores it and replays the 500.
func TestServerError(t *testing.T) {
	for _, s := range sides(t) {
		t.Run(s.name, func(t *testing.T) {
			e := &effects{status: http.StatusInternalServerError}
			url := s.start(e)
			key := uuid.NewString()
			for range 2 {
				if r := send(t, s, url, key, order); r.status != http.StatusInternalServerError {
					t.Errorf("status %d, want 500", r.status)
				}
			}
			if n, want := e.runs.Load(), pick(s, int64(2), int64(1)); n != want {
				t.Errorf("handler ran %d times, want %d", n, want)
			}
		})
	}
}

// TestKeyChecks: without a key idemhttp answers 400 and Fiber passes the
// request through to the handler; a key that is not 36 characters long is a
// 500 on Fiber (its validator's error reaches the default error handler),
// and a key too easy to guess a 400 on idemhttp.
func TestKeyChecks(t *testing.T) {
	for _, s := range sides(t) {
		t.Run(s.name, func(t *testing.T) {
			e := &effects{}
			url := s.start(e)
			if r, want := send(t, s, url, "", order), pick(s, http.StatusBadRequest, http.StatusCreated); r.status != want {
				t.Errorf("no key: status %d, want %d", r.status, want)
			}
			if r, want := send(t, s, url, "order-1", order), pick(s, http.StatusBadRequest, http.StatusInternalServerError); r.status != want {
				t.Errorf("key order-1: status %d, want %d", r.status, want)
			}
			if n, want := e.runs.Load(), pick(s, int64(0), int64(1)); n != want {
				t.Errorf("handler ran %d times, want %d", n, want)
			}
		})
	}
}

// gated is effects whose runs each wait for release.
func gated() *effects {
	return &effects{entered: make(chan struct{}, 8), release: make(chan struct{})}
}

// TestInFlightSameInstance: a repeat while the first request runs gets 409
// in-flight at once from idemhttp; on Fiber it waits on the key's lock and
// then replays. The handler runs once on both.
func TestInFlightSameInstance(t *testing.T) {
	for _, s := range sides(t) {
		t.Run(s.name, func(t *testing.T) {
			e := gated()
			url := s.start(e)
			key := uuid.NewString()
			first := make(chan reply, 1)
			go func() { first <- send(t, s, url, key, order) }()
			<-e.entered
			second := make(chan reply, 1)
			go func() { second <- send(t, s, url, key, order) }()
			var r2 reply
			if !s.fiber {
				r2 = <-second // answered while the first still runs
			}
			close(e.release)
			r1 := <-first
			if s.fiber {
				r2 = <-second
			}
			if r1.status != http.StatusCreated {
				t.Errorf("first: status %d, want 201", r1.status)
			}
			if want := pick(s, http.StatusConflict, http.StatusCreated); r2.status != want {
				t.Errorf("second: status %d, want %d", r2.status, want)
			}
			if n := e.runs.Load(); n != 1 {
				t.Errorf("handler ran %d times, want 1", n)
			}
		})
	}
}

// TestInFlightTwoInstances: two instances share a Redis store. A repeat
// sent to the second while the first runs gets 409 from idemhttp (the key is
// claimed in Redis); on Fiber the lock is in process, nothing is in Redis
// until the first finishes, and the second instance runs the handler too.
func TestInFlightTwoInstances(t *testing.T) {
	for _, s := range sides(t) {
		if !strings.HasSuffix(s.name, "-redis") {
			continue
		}
		t.Run(s.name, func(t *testing.T) {
			e := gated()
			a, b := s.start(e), s.start(e)
			key := uuid.NewString()
			first := make(chan reply, 1)
			go func() { first <- send(t, s, a, key, order) }()
			<-e.entered
			second := make(chan reply, 1)
			go func() { second <- send(t, s, b, key, order) }()
			var r2 reply
			ranTwice := false
			select {
			case r2 = <-second: // answered without running the handler
			case <-e.entered: // the second instance runs the handler too
				ranTwice = true
			}
			close(e.release)
			r1 := <-first
			if ranTwice {
				r2 = <-second
			}
			if r1.status != http.StatusCreated {
				t.Errorf("first: status %d, want 201", r1.status)
			}
			if want := pick(s, http.StatusConflict, http.StatusCreated); r2.status != want {
				t.Errorf("second: status %d, want %d", r2.status, want)
			}
			if n, want := e.runs.Load(), pick(s, int64(1), int64(2)); n != want {
				t.Errorf("handler ran %d times, want %d", n, want)
			}
		})
	}
}
