package idemhttp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/idemhttp"
)

const order = `{"amount": 4200, "currency": "EUR"}`

// TestConcurrentRequestsOneEffect sends 50 requests with one key at once
// through a real server: one runs the handler, the rest are replays of its
// answer or 409s, never a second charge.
func TestConcurrentRequestsOneEffect(t *testing.T) {
	for _, sc := range allStores {
		t.Run(sc.name, func(t *testing.T) {
			pay := &payments{delay: 20 * time.Millisecond}
			srv := serve(t, newMiddleware(t, sc.store(t)).Wrap(pay))
			answers := sendAtOnce(t, srv.URL+"/payments", newKey(), 50)
			checkOneEffect(t, pay, answers)
		})
	}
}

// checkOneEffect asserts one charge, one original 201, and only replays of
// it or in-flight 409s besides.
func checkOneEffect(t *testing.T, pay *payments, answers []answer) {
	t.Helper()
	if n := pay.charges.Load(); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
	originals, replays, inflight := 0, 0, 0
	for _, a := range answers {
		switch {
		case a.status == http.StatusCreated && !a.replayed():
			originals++
			if a.body != pay.firstBody() {
				t.Errorf("original body %q, handler wrote %q", a.body, pay.firstBody())
			}
		case a.status == http.StatusCreated:
			replays++
			if a.body != pay.firstBody() {
				t.Errorf("replayed body %q, want %q", a.body, pay.firstBody())
			}
			if a.header.Get("Set-Cookie") != "" || a.header.Get("Location") == "" {
				t.Errorf("replayed headers %v: want Location, no Set-Cookie", a.header)
			}
		case a.status == http.StatusConflict && a.problemType() == problem(idemhttp.ProblemInFlight):
			inflight++
			if a.header.Get("Retry-After") == "" {
				t.Error("409 without Retry-After")
			}
		default:
			t.Errorf("unexpected answer %d %q", a.status, a.body)
		}
	}
	if originals != 1 {
		t.Errorf("%d original answers, want 1", originals)
	}
	t.Logf("1 charge: 1 original, %d replays, %d in-flight 409s", replays, inflight)
}

// dropTransport sends each request to the server, reads the whole response,
// then drops it for the first drops requests, as a connection that dies on
// the way back would.
type dropTransport struct {
	base  http.RoundTripper
	mu    sync.Mutex
	drops int
}

func (d *dropTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := d.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	drop := d.drops > 0
	d.drops--
	d.mu.Unlock()
	if drop {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return nil, errors.New("connection reset after the server answered")
	}
	return resp, nil
}

// TestRetryingClientGetsFirstAnswer retries a payment through lost
// responses, as a client library does, and ends with the first answer.
func TestRetryingClientGetsFirstAnswer(t *testing.T) {
	for _, sc := range allStores {
		t.Run(sc.name, func(t *testing.T) {
			pay := &payments{}
			srv := serve(t, newMiddleware(t, sc.store(t)).Wrap(pay))
			client := &http.Client{Transport: &dropTransport{base: http.DefaultTransport, drops: 3}}
			key := newKey()
			var got answer
			var tries int
			for tries = 1; tries <= 10; tries++ {
				a, err := post(t, client, srv.URL+"/payments", key, order)
				if err == nil {
					got = a
					break
				}
			}
			if tries != 4 || got.status != http.StatusCreated || !got.replayed() {
				t.Fatalf("after %d tries: %d replayed=%v %q", tries, got.status, got.replayed(), got.body)
			}
			if got.body != pay.firstBody() {
				t.Errorf("client got %q, first answer was %q", got.body, pay.firstBody())
			}
			if n := pay.charges.Load(); n != 1 {
				t.Errorf("%d charges, want 1", n)
			}
		})
	}
}

func TestStateMachine(t *testing.T) {
	for _, sc := range allStores {
		t.Run(sc.name, func(t *testing.T) { testStateMachine(t, sc.store(t)) })
	}
}

func testStateMachine(t *testing.T, store dedup.Store) {
	pay := &payments{}
	srv := serve(t, newMiddleware(t, store).Wrap(pay))
	url := srv.URL + "/payments"
	key := newKey()

	first := mustPost(t, url, key, order)
	if first.status != http.StatusCreated || first.replayed() {
		t.Fatalf("first: %d replayed=%v", first.status, first.replayed())
	}
	// Same JSON, other key order and spacing: the same request.
	again := mustPost(t, url, key, `{"currency":"EUR","amount":4200}`)
	if again.status != http.StatusCreated || !again.replayed() || again.body != first.body ||
		again.header.Get("Location") != first.header.Get("Location") ||
		again.header.Get("Content-Type") != first.header.Get("Content-Type") {
		t.Errorf("replay %d %v %q, want %q", again.status, again.header, again.body, first.body)
	}
	reused := mustPost(t, url, key, `{"amount": 1, "currency": "EUR"}`)
	if reused.status != http.StatusUnprocessableEntity || reused.problemType() != problem(idemhttp.ProblemKeyReused) ||
		strings.Contains(reused.body, "ch_") {
		t.Errorf("reused key: %d %q", reused.status, reused.body)
	}
	otherRoute := mustPost(t, srv.URL+"/refunds", key, order)
	if otherRoute.status != http.StatusUnprocessableEntity {
		t.Errorf("key on another route: %d", otherRoute.status)
	}
	// A final 4xx is stored and replayed; a replay runs nothing.
	badKey := newKey()
	bad := mustPost(t, url, badKey, `{"amount": -1}`)
	badAgain := mustPost(t, url, badKey, `{"amount": -1}`)
	if bad.status != http.StatusBadRequest || badAgain.status != http.StatusBadRequest || !badAgain.replayed() || badAgain.body != bad.body {
		t.Errorf("final 400: %d then %d replayed=%v", bad.status, badAgain.status, badAgain.replayed())
	}
	if n := pay.charges.Load(); n != 1 {
		t.Errorf("%d charges, want 1", n)
	}
}

func TestConflictStatusOption(t *testing.T) {
	srv := serve(t, newMiddleware(t, dedup.NewMemoryStore(), idemhttp.WithConflictStatus(http.StatusConflict)).Wrap(&payments{}))
	key := newKey()
	mustPost(t, srv.URL, key, order)
	if a := mustPost(t, srv.URL, key, `{"amount": 1}`); a.status != http.StatusConflict || a.problemType() != problem(idemhttp.ProblemKeyReused) {
		t.Errorf("reused key with WithConflictStatus(409): %d %q", a.status, a.body)
	}
}

// blocking is a handler that charges, then waits for release.
type blocking struct {
	payments
	entered chan struct{}
	release chan struct{}
}

func newBlocking() *blocking {
	return &blocking{entered: make(chan struct{}, 100), release: make(chan struct{})}
}

func (b *blocking) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.entered <- struct{}{}
	<-b.release
	b.payments.ServeHTTP(w, r)
}

func TestInFlightAccepted(t *testing.T) {
	h := newBlocking()
	m := newMiddleware(t, dedup.NewMemoryStore(), idemhttp.WithInFlightAccepted(func(r *http.Request, key string) string {
		return "/payments/by-key/" + key
	}))
	srv := serve(t, m.Wrap(h))
	key := newKey()
	done := make(chan answer)
	go func() { done <- mustPost(t, srv.URL, key, order) }()
	<-h.entered
	a := mustPost(t, srv.URL, key, order)
	if a.status != http.StatusAccepted || a.header.Get("Location") != "/payments/by-key/"+key || a.header.Get("Retry-After") != "1" {
		t.Errorf("in flight: %d %v", a.status, a.header)
	}
	close(h.release)
	if first := <-done; first.status != http.StatusCreated {
		t.Errorf("first: %d", first.status)
	}
}

// TestNotStoredAnswersStayRetryable: a 5xx, a panic, a response over the
// snapshot limit and one whose stored headers could not be replayed (a
// control character, over 64 values) are answered, not stored; the next
// retry runs again.
func TestNotStoredAnswersStayRetryable(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	runs := 0
	var mode string
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		runs++
		mu.Unlock()
		switch mode {
		case "503":
			http.Error(w, "gateway down", http.StatusServiceUnavailable)
		case "panic":
			panic("handler bug")
		case "big":
			w.Write(bytes.Repeat([]byte("x"), 2048))
		case "control":
			w.Header().Set("Location", "/payments/\x01")
			w.WriteHeader(http.StatusCreated)
		case "many":
			for i := range 65 {
				w.Header().Add("Link", fmt.Sprintf("</payments/%d>; rel=item", i))
			}
			w.WriteHeader(http.StatusCreated)
		default:
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "ok")
		}
	})
	m := newMiddleware(t, dedup.NewMemoryStore(), idemhttp.WithMaxSnapshotBytes(1024),
		idemhttp.WithStoredHeaders("Location", "Link"),
		idemhttp.WithLogger(slog.New(slog.NewTextHandler(&syncWriter{w: &logs, mu: &mu}, nil))))
	srv := serve(t, m.Wrap(h))
	for _, tc := range []struct {
		mode   string
		status int // 0: no answer the client accepts
	}{
		{"503", 503},
		{"panic", 0}, // the connection is aborted
		{"big", 200},
		{"control", 0}, // sent as written, which Go's client refuses as malformed
		{"many", 201},
	} {
		key := newKey()
		mode = tc.mode
		a, err := post(t, http.DefaultClient, srv.URL, key, order)
		switch {
		case tc.status == 0 && err == nil:
			t.Errorf("%s: got %d, want no answer", tc.mode, a.status)
		case tc.status != 0 && (err != nil || a.status != tc.status || a.replayed()):
			t.Errorf("%s: %d %v", tc.mode, a.status, err)
		case tc.mode == "big" && len(a.body) != 2048:
			t.Errorf("big answer cut to %d bytes", len(a.body))
		}
		mode = "ok"
		if a := mustPost(t, srv.URL, key, order); a.status != http.StatusCreated || a.replayed() {
			t.Errorf("%s: retry got %d replayed=%v, want the handler run again", tc.mode, a.status, a.replayed())
		}
	}
	// Eleven: net/http's Transport retries a request that carries an
	// Idempotency-Key once when the connection dies without an answer, so
	// the panicking request ran twice (and the key stayed retryable).
	if runs != 11 {
		t.Errorf("%d runs, want 11", runs)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "not stored (over the snapshot limit)") {
		t.Errorf("no warning for the oversized snapshot in %q", logs.String())
	}
	if n := strings.Count(logs.String(), "level=WARN msg=\"idemhttp: response answered but not stored (its headers could not be replayed)"); n != 2 {
		t.Errorf("%d warnings for unreplayable headers, want 2, in %q", n, logs.String())
	}
}

type syncWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// TestTenantsDoNotShareKeys: the same key from two callers is two
// operations; neither sees the other's answer.
func TestTenantsDoNotShareKeys(t *testing.T) {
	pay := &payments{}
	m := newMiddleware(t, dedup.NewMemoryStore(), idemhttp.WithTenant(func(r *http.Request) (string, error) {
		user, _, ok := r.BasicAuth()
		if !ok {
			return "", errors.New("not authenticated")
		}
		return user, nil
	}))
	srv := serve(t, m.Wrap(pay))
	key := newKey()
	send := func(user string) answer {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(order))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", `"`+key+`"`)
		if user != "" {
			req.SetBasicAuth(user, "pw")
		}
		a, err := do(http.DefaultClient, req)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	alice := send("alice")
	bob := send("bob")
	aliceAgain := send("alice")
	if bob.replayed() || bob.body == alice.body || !aliceAgain.replayed() || aliceAgain.body != alice.body {
		t.Errorf("alice %q, bob %q (replayed=%v), alice again %q", alice.body, bob.body, bob.replayed(), aliceAgain.body)
	}
	if anon := send(""); anon.status != http.StatusForbidden || anon.problemType() != problem(idemhttp.ProblemTenant) {
		t.Errorf("no caller: %d %q", anon.status, anon.body)
	}
	if n := pay.charges.Load(); n != 2 {
		t.Errorf("%d charges, want 2", n)
	}
}

// stallingExtend is a store whose lease extensions fail, as when the store
// is briefly unreachable, so that a long handler's lease lapses.
type stallingExtend struct{ dedup.Store }

func (stallingExtend) Extend(context.Context, dedup.Key, string, time.Duration) error {
	return errors.New("store unreachable")
}

// TestLongHandlerKeepsItsLease: a handler running for several leases keeps
// the key (a concurrent retry gets 409, not a second run).
func TestLongHandlerKeepsItsLease(t *testing.T) {
	h := newBlocking()
	srv := serve(t, newMiddleware(t, dedup.NewMemoryStore(), idemhttp.WithLease(time.Second)).Wrap(h))
	key := newKey()
	done := make(chan answer)
	go func() { done <- mustPost(t, srv.URL, key, order) }()
	<-h.entered
	time.Sleep(2500 * time.Millisecond) // two and a half leases
	if a := mustPost(t, srv.URL, key, order); a.status != http.StatusConflict {
		t.Errorf("retry during a long handler: %d %q, want 409", a.status, a.body)
	}
	close(h.release)
	if first := <-done; first.status != http.StatusCreated {
		t.Errorf("first: %d", first.status)
	}
	if n := h.charges.Load(); n != 1 {
		t.Errorf("%d charges", n)
	}
}

// TestHandlerOutlivingItsLease: when a lease lapses and another request
// takes the key over, the first handler's answer is not stored over the new
// owner's; its client gets a 503 lease-lost problem and its retry the new
// owner's stored answer.
func TestHandlerOutlivingItsLease(t *testing.T) {
	h := newBlocking()
	srv := serve(t, newMiddleware(t, stallingExtend{dedup.NewMemoryStore()}, idemhttp.WithLease(100*time.Millisecond)).Wrap(h))
	key := newKey()
	done := make(chan answer)
	go func() { done <- mustPost(t, srv.URL, key, order) }()
	<-h.entered
	time.Sleep(250 * time.Millisecond)
	second := make(chan answer)
	go func() { second <- mustPost(t, srv.URL, key, order) }()
	<-h.entered // the takeover runs the handler
	h.release <- struct{}{}
	h.release <- struct{}{}
	a, b := <-done, <-second
	if a.status == http.StatusServiceUnavailable {
		a, b = b, a
	}
	if a.status != http.StatusCreated || b.status != http.StatusServiceUnavailable || b.problemType() != problem(idemhttp.ProblemLeaseLost) {
		t.Fatalf("answers %d %q and %d %q", a.status, a.body, b.status, b.body)
	}
	if r := mustPost(t, srv.URL, key, order); !r.replayed() || r.body != a.body {
		t.Errorf("retry after the takeover: %q, want the new owner's %q", r.body, a.body)
	}
}

// corruptResults is a store whose stored results come back damaged.
type corruptResults struct{ dedup.Store }

func (c corruptResults) Claim(ctx context.Context, req dedup.ClaimRequest) (dedup.Claim, error) {
	cl, err := c.Store.Claim(ctx, req)
	if len(cl.Record.Result) > 4 {
		cl.Record.Result = cl.Record.Result[:4]
	}
	return cl, err
}

// A damaged stored answer is refused, never replayed nor cached: the
// instance that answered replays what it stored from its cache, another
// reads the damaged record from the store every time.
func TestMalformedSnapshotIsNotReplayed(t *testing.T) {
	store := corruptResults{dedup.NewMemoryStore()}
	first := serve(t, newMiddleware(t, store).Wrap(&payments{}))
	other := serve(t, newMiddleware(t, store).Wrap(&payments{}))
	key := newKey()
	answered := mustPost(t, first.URL, key, order)
	for range 2 {
		if a := mustPost(t, other.URL, key, order); a.status != http.StatusInternalServerError || a.problemType() != problem(idemhttp.ProblemStoredMalformed) {
			t.Errorf("damaged snapshot: %d %q", a.status, a.body)
		}
	}
	if a := mustPost(t, first.URL, key, order); !a.replayed() || a.body != answered.body {
		t.Errorf("the answering instance's replay: %d %q, want its answer %q", a.status, a.body, answered.body)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	var nilStore *dedup.MemoryStore
	for name, f := range map[string]func() error{
		"nil store":       func() error { _, err := idemhttp.New(nil, idemhttp.WithScope("s")); return err },
		"typed nil store": func() error { _, err := idemhttp.New(nilStore, idemhttp.WithScope("s")); return err },
		"no scope":        func() error { _, err := idemhttp.New(dedup.NewMemoryStore()); return err },
		"bad header": func() error {
			_, err := idemhttp.New(dedup.NewMemoryStore(), idemhttp.WithScope("s"), idemhttp.WithHeader("Idem Key"))
			return err
		},
		"conflict 400": func() error {
			_, err := idemhttp.New(dedup.NewMemoryStore(), idemhttp.WithScope("s"), idemhttp.WithConflictStatus(400))
			return err
		},
		"final 500": func() error {
			_, err := idemhttp.New(dedup.NewMemoryStore(), idemhttp.WithScope("s"), idemhttp.WithFinalStatuses(500))
			return err
		},
		"nil tx store": func() error { _, err := idemhttp.NewTx(nil, nil, idemhttp.WithScope("s")); return err },
		"negative replay cache": func() error {
			_, err := idemhttp.New(dedup.NewMemoryStore(), idemhttp.WithScope("s"), idemhttp.WithReplayCache(-1))
			return err
		},
		"replay cache max age 0": func() error {
			_, err := idemhttp.New(dedup.NewMemoryStore(), idemhttp.WithScope("s"), idemhttp.WithReplayCacheMaxAge(0))
			return err
		},
	} {
		if err := f(); !errors.Is(err, dedup.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
}

// TestClientGoneLeavesKeyRetryable: a handler that gives up when its client
// goes away, writing nothing, leaves the key retryable; one that still
// answers 201 (its effect happened) has that answer stored and replayed.
func TestClientGoneLeavesKeyRetryable(t *testing.T) {
	var mu sync.Mutex
	runs := map[string]int{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mode := r.URL.Query().Get("mode")
		mu.Lock()
		runs[mode]++
		n := runs[mode]
		mu.Unlock()
		if n == 1 {
			<-r.Context().Done()
			if mode == "gives-up" {
				return
			}
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
	})
	srv := serve(t, newMiddleware(t, dedup.NewMemoryStore()).Wrap(h))
	impatient := &http.Client{Timeout: 100 * time.Millisecond}
	for _, mode := range []string{"gives-up", "finishes"} {
		url := srv.URL + "/payments?mode=" + mode
		key := newKey()
		if _, err := post(t, impatient, url, key, order); err == nil {
			t.Fatalf("%s: the impatient client got an answer", mode)
		}
		var a answer
		for range 50 { // until the first run has settled
			if a = mustPost(t, url, key, order); a.status != http.StatusConflict {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		mu.Lock()
		n := runs[mode]
		mu.Unlock()
		switch {
		case mode == "gives-up" && (a.status != http.StatusCreated || a.replayed() || n != 2):
			t.Errorf("gave up: retry %d replayed=%v after %d runs, want a second run", a.status, a.replayed(), n)
		case mode == "finishes" && (a.status != http.StatusCreated || !a.replayed() || n != 1):
			t.Errorf("finished: retry %d replayed=%v after %d runs, want the stored answer", a.status, a.replayed(), n)
		}
	}
}

// TestPolicyVersion: a retry after a rule change replays the first decision;
// bumping the policy version makes the old key conflict instead.
func TestPolicyVersion(t *testing.T) {
	store := dedup.NewMemoryStore()
	pay := &payments{}
	v1 := serve(t, newMiddleware(t, store, idemhttp.WithPolicyVersion("tariff-2026")).Wrap(pay))
	same := serve(t, newMiddleware(t, store, idemhttp.WithPolicyVersion("tariff-2026")).Wrap(pay))
	v2 := serve(t, newMiddleware(t, store, idemhttp.WithPolicyVersion("tariff-2027")).Wrap(pay))
	key := newKey()
	first := mustPost(t, v1.URL, key, order)
	if a := mustPost(t, same.URL, key, order); !a.replayed() || a.body != first.body {
		t.Errorf("same version: %d replayed=%v", a.status, a.replayed())
	}
	if a := mustPost(t, v2.URL, key, order); a.status != http.StatusUnprocessableEntity {
		t.Errorf("new version: %d, want 422", a.status)
	}
	if n := pay.charges.Load(); n != 1 {
		t.Errorf("%d charges", n)
	}
}

// TestServerDeadlineBeforeAnswer: a handler cut off by a server-side
// deadline before it wrote anything gets a 503 request-abandoned, never an
// empty 200, and the key stays retryable.
func TestServerDeadlineBeforeAnswer(t *testing.T) {
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			<-r.Context().Done()
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	m := newMiddleware(t, dedup.NewMemoryStore()).Wrap(h)
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 50*time.Millisecond)
		defer cancel()
		m.ServeHTTP(w, r.WithContext(ctx))
	}))
	key := newKey()
	if a := mustPost(t, srv.URL, key, order); a.status != http.StatusServiceUnavailable || a.problemType() != problem(idemhttp.ProblemAbandoned) || a.header.Get("Retry-After") == "" {
		t.Errorf("cut off: %d %q", a.status, a.body)
	}
	if a := mustPost(t, srv.URL, key, order); a.status != http.StatusCreated || a.replayed() {
		t.Errorf("retry: %d replayed=%v, want a second run", a.status, a.replayed())
	}
}

// TestClientGoneMidHandlerKeepsTheLease: a client that disconnects while a
// handler outlasting several leases runs does not end the heartbeat. A retry
// during the handler gets 409, not a second charge; once the handler answers
// 201 (to nobody), that answer is stored and the retry replays it.
func TestClientGoneMidHandlerKeepsTheLease(t *testing.T) {
	for _, sc := range allStores {
		t.Run(sc.name, func(t *testing.T) {
			// Long enough that a heartbeat delayed by a loaded machine (one
			// every third of it) still lands before the lease lapses: with
			// 300 ms, a retry took the key over at a load average of 9.
			const lease = time.Second
			pay := &payments{}
			var runs atomic.Int64
			entered, gone, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					close(entered)
					<-r.Context().Done() // the client went away
					close(gone)
					<-release // the charge goes on regardless
				}
				pay.ServeHTTP(w, r)
			})
			srv := serve(t, newMiddleware(t, sc.store(t), idemhttp.WithLease(lease)).Wrap(h))
			url, key := srv.URL+"/payments", newKey()

			ctx, disconnect := context.WithCancel(context.Background())
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(order))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", `"`+key+`"`)
			first := make(chan error, 1)
			go func() { _, err := do(http.DefaultClient, req); first <- err }()
			<-entered
			disconnect()
			<-gone
			if err := <-first; err == nil {
				t.Fatal("the disconnected client got an answer")
			}
			time.Sleep(3 * lease) // the lease would have lapsed without a heartbeat
			if a := mustPost(t, url, key, order); a.status != http.StatusConflict || a.problemType() != problem(idemhttp.ProblemInFlight) {
				t.Errorf("retry during the handler: %d %q, want 409 in-flight", a.status, a.body)
			}
			close(release)
			var a answer
			for range 100 { // until the handler has answered and settled
				if a = mustPost(t, url, key, order); a.status != http.StatusConflict {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if a.status != http.StatusCreated || !a.replayed() || a.body != pay.firstBody() {
				t.Errorf("retry after the handler: %d replayed=%v %q, want the stored %q", a.status, a.replayed(), a.body, pay.firstBody())
			}
			if n := pay.charges.Load(); n != 1 {
				t.Errorf("%d charges, want 1", n)
			}
		})
	}
}

// TestQueryIsInTheFingerprint: the same key sent with another query is
// another request (422, never the first answer); the same parameters in
// another order or encoding are the same request (a replay).
func TestQueryIsInTheFingerprint(t *testing.T) {
	pay := &payments{}
	srv := serve(t, newMiddleware(t, dedup.NewMemoryStore()).Wrap(pay))
	key := newKey()
	first := mustPost(t, srv.URL+"/payments?amount=1&currency=EUR", key, order)
	if first.status != http.StatusCreated || first.replayed() {
		t.Fatalf("first: %d %q", first.status, first.body)
	}
	if a := mustPost(t, srv.URL+"/payments?amount=2&currency=EUR", key, order); a.status != http.StatusUnprocessableEntity ||
		a.problemType() != problem(idemhttp.ProblemKeyReused) || strings.Contains(a.body, "ch_") {
		t.Errorf("other query: %d %q, want 422 key-reused", a.status, a.body)
	}
	if a := mustPost(t, srv.URL+"/payments", key, order); a.status != http.StatusUnprocessableEntity {
		t.Errorf("no query: %d %q, want 422", a.status, a.body)
	}
	if a := mustPost(t, srv.URL+"/payments?currency=%45UR&amount=1", key, order); !a.replayed() || a.body != first.body {
		t.Errorf("same query, other order and encoding: %d replayed=%v, want the replay", a.status, a.replayed())
	}
	if n := pay.charges.Load(); n != 1 {
		t.Errorf("%d charges, want 1", n)
	}
}

// TestFingerprintWithoutQueryUnchanged pins the fingerprint of a request
// without a query: keys stored before the query counted must replay after.
func TestFingerprintWithoutQueryUnchanged(t *testing.T) {
	store := dedup.NewMemoryStore()
	srv := serve(t, newMiddleware(t, store).Wrap(&payments{}))
	key := newKey()
	mustPost(t, srv.URL+"/payments", key, order)
	rec, err := store.Get(context.Background(), dedup.Key{Scope: "payments-api", EventID: key})
	if err != nil {
		t.Fatal(err)
	}
	if want := "5d523bf03629ba792831bca9c36546dd2d09b82731574bb51ce376ef5b306744"; rec.Fingerprint != want {
		t.Errorf("fingerprint %s, want %s", rec.Fingerprint, want)
	}
}

// TestResponseControllerThroughTheRecorder: http.ResponseController works
// on the middleware's writer. While the answer is held to be stored, Flush
// does nothing and the answer is stored whole; deadlines reach the
// connection; Hijack is refused. Past the snapshot limit, Flush sends what
// streamed to the client while the handler still runs.
func TestResponseControllerThroughTheRecorder(t *testing.T) {
	received := make(chan struct{})
	handlerErrs := make(chan error, 10)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if r.URL.Query().Has("stream") {
			w.Write(bytes.Repeat([]byte("x"), 2048))
			handlerErrs <- rc.Flush()
			select {
			case <-received: // the client read the flushed bytes
			case <-time.After(10 * time.Second):
				handlerErrs <- errors.New("the flushed bytes never reached the client")
			}
			io.WriteString(w, "end")
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
		handlerErrs <- rc.Flush()
		handlerErrs <- rc.SetWriteDeadline(time.Now().Add(time.Minute))
		if _, _, err := rc.Hijack(); !errors.Is(err, http.ErrNotSupported) {
			handlerErrs <- fmt.Errorf("hijack: %v, want ErrNotSupported", err)
		}
		io.WriteString(w, " once")
	})
	srv := serve(t, newMiddleware(t, dedup.NewMemoryStore(), idemhttp.WithMaxSnapshotBytes(1024)).Wrap(h))
	key := newKey()
	first := mustPost(t, srv.URL, key, order)
	again := mustPost(t, srv.URL, key, order)
	if first.status != http.StatusCreated || first.body != "charged once" || !again.replayed() || again.body != first.body {
		t.Errorf("flushed answer %d %q, then %d replayed=%v %q", first.status, first.body, again.status, again.replayed(), again.body)
	}

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"?stream", strings.NewReader(order))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", `"`+newKey()+`"`)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	head := make([]byte, 2048)
	if _, err := io.ReadFull(resp.Body, head); err != nil {
		t.Fatal(err)
	}
	close(received)
	if rest, err := io.ReadAll(resp.Body); err != nil || string(rest) != "end" {
		t.Errorf("rest of the stream %q %v", rest, err)
	}
	close(handlerErrs)
	for err := range handlerErrs {
		if err != nil {
			t.Error(err)
		}
	}
}

// TestWaitInFlightReplaysToEveryone sends 50 requests with one key at once,
// half to each of two instances sharing the store, with WithWaitInFlight:
// one runs the handler, and the 49 others wait and replay its answer, none
// answered 409.
func TestWaitInFlightReplaysToEveryone(t *testing.T) {
	for _, sc := range allStores {
		t.Run(sc.name, func(t *testing.T) {
			store := sc.store(t)
			pay := &payments{delay: 200 * time.Millisecond}
			// A minute is a bound, not a wait: each waiter replays as soon as
			// the answer is stored.
			a := serve(t, newMiddleware(t, store, idemhttp.WithWaitInFlight(time.Minute)).Wrap(pay))
			b := serve(t, newMiddleware(t, store, idemhttp.WithWaitInFlight(time.Minute)).Wrap(pay))
			key := newKey()
			answers := make([]answer, 50)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range answers {
				url := a.URL
				if i%2 == 1 {
					url = b.URL
				}
				wg.Go(func() {
					<-start
					got, err := post(t, http.DefaultClient, url+"/payments", key, order)
					if err != nil {
						t.Error(err)
					}
					answers[i] = got
				})
			}
			close(start)
			wg.Wait()
			checkOneEffect(t, pay, answers)
			for _, got := range answers {
				if got.status != http.StatusCreated {
					t.Fatalf("answer %d %q: every request should have waited for the first", got.status, got.body)
				}
			}
		})
	}
}

// TestWaitInFlightEnds: past its wait, a request whose key is still in
// flight gets the 409, and the handler runs once.
func TestWaitInFlightEnds(t *testing.T) {
	release := make(chan struct{})
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		<-release
		w.WriteHeader(http.StatusCreated)
	})
	srv := serve(t, newMiddleware(t, dedup.NewMemoryStore(), idemhttp.WithWaitInFlight(50*time.Millisecond)).Wrap(h))
	key := newKey()
	first := make(chan answer, 1)
	go func() {
		got, err := post(t, http.DefaultClient, srv.URL+"/payments", key, order)
		if err != nil {
			t.Error(err)
		}
		first <- got
	}()
	for runs.Load() == 0 {
		time.Sleep(time.Millisecond) // until the first request holds the key
	}
	second, err := post(t, http.DefaultClient, srv.URL+"/payments", key, order)
	close(release)
	if err != nil {
		t.Fatal(err)
	}
	if second.status != http.StatusConflict || second.problemType() != problem(idemhttp.ProblemInFlight) {
		t.Errorf("second request: %d %q, want the in-flight 409", second.status, second.body)
	}
	if got := <-first; got.status != http.StatusCreated {
		t.Errorf("first request: %d %q", got.status, got.body)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("%d runs, want 1", n)
	}
}

// Answers buffered one after another and side by side never carry one
// another's status, headers or body: 50 goroutines, each request with a
// header and a body of its own, half of them answering without the header.
func TestAnswersStayApartUnderConcurrency(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if tag := r.Header.Get("X-Tag"); tag != "" && len(b)%2 == 0 {
			w.Header().Set("Location", "/things/"+tag)
			w.WriteHeader(http.StatusCreated)
		}
		w.Write(b)
	})
	srv := serve(t, newMiddleware(t, dedup.NewMemoryStore(), idemhttp.WithStoredHeaders("Location")).Wrap(h))
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for g := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				tag := fmt.Sprintf("g%d-%d", g, i)
				body := `{"tag":"` + tag + `"` + strings.Repeat(" ", (g+i)%2) + `}`
				req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
				req.Header.Set("Idempotency-Key", strconv.Quote(newKey()))
				req.Header.Set("X-Tag", tag)
				a, err := do(http.DefaultClient, req)
				wantStatus, wantLocation := http.StatusOK, ""
				if len(body)%2 == 0 {
					wantStatus, wantLocation = http.StatusCreated, "/things/"+tag
				}
				switch {
				case err != nil:
					errs <- err
				case a.status != wantStatus || a.header.Get("Location") != wantLocation || a.body != body:
					errs <- fmt.Errorf("%s: answered %d %q %q; want %d %q %q", tag, a.status, a.header.Get("Location"), a.body,
						wantStatus, wantLocation, body)
				default:
					continue
				}
				return
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A first answer is sent with its length, as a bare handler's is, whether
// the server counts it (a short body) or the middleware says it (one the
// server would send in chunks); its replay is sent alike.
func TestAnswerLength(t *testing.T) {
	srv := serve(t, newMiddleware(t, dedup.NewMemoryStore()).Wrap(http.HandlerFunc(sized)))
	for _, size := range []int{0, 100, 2048, 2049, 10000} {
		key := newKey()
		for _, a := range []answer{mustPost(t, srv.URL+"?size="+strconv.Itoa(size), key, order), mustPost(t, srv.URL+"?size="+strconv.Itoa(size), key, order)} {
			if a.status != http.StatusOK || len(a.body) != size || a.header.Get("Content-Length") != strconv.Itoa(size) {
				t.Errorf("%d bytes (replayed %v): %d, %d bytes, Content-Length %q", size, a.replayed(), a.status, len(a.body), a.header.Get("Content-Length"))
			}
		}
	}
}
