package idemhttp_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/idemhttp"
)

// storeCase names a store the state-machine tests run on.
type storeCase struct {
	name  string
	store func(t *testing.T) dedup.Store
}

func memoryStore(*testing.T) dedup.Store { return dedup.NewMemoryStore() }

// payments is a handler charging a fake gateway: every run is one effect,
// and each answer carries the charge's own number.
type payments struct {
	charges atomic.Int64
	delay   time.Duration
	mu      sync.Mutex
	bodies  []string // every body the handler answered with
}

func (p *payments) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Amount int `json:"amount"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Amount <= 0 {
		http.Error(w, "bad amount", http.StatusBadRequest)
		return
	}
	n := p.charges.Add(1)
	if p.delay > 0 {
		time.Sleep(p.delay)
	}
	body := fmt.Sprintf(`{"id":"ch_%d","amount":%d,"at":%d}`, n, req.Amount, time.Now().UnixNano())
	p.mu.Lock()
	p.bodies = append(p.bodies, body)
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/ch_"+strconv.FormatInt(n, 10))
	w.Header().Set("Set-Cookie", "session=secret")
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, body)
}

func (p *payments) firstBody() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.bodies) == 0 {
		return ""
	}
	return p.bodies[0]
}

// serve starts a real http.Server on loopback with h.
func serve(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func newMiddleware(t *testing.T, store dedup.Store, opts ...idemhttp.Opt) *idemhttp.Middleware {
	t.Helper()
	m, err := idemhttp.New(store, append([]idemhttp.Opt{idemhttp.WithScope("payments-api"),
		idemhttp.WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// answer is a response read whole.
type answer struct {
	status int
	header http.Header
	body   string
}

func (a answer) replayed() bool { return a.header.Get(idemhttp.ReplayHeader) == "true" }

// problemType returns the problem type of a problem answer, or "".
func (a answer) problemType() string {
	if a.header.Get("Content-Type") != idemhttp.ProblemContentType {
		return ""
	}
	var doc struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	if json.Unmarshal([]byte(a.body), &doc) != nil || doc.Status != a.status {
		return "unreadable problem: " + a.body
	}
	return doc.Type
}

func problem(p idemhttp.Problem) string { return idemhttp.DefaultProblemBase + string(p) }

// post sends a POST with key (quoted as a Structured Field string unless
// raw) and a JSON body.
func post(t *testing.T, c *http.Client, url, key, body string) (answer, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", strconv.Quote(key))
	}
	return do(c, req)
}

func do(c *http.Client, req *http.Request) (answer, error) {
	resp, err := c.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b)}, err
}

func mustPost(t *testing.T, url, key, body string) answer {
	t.Helper()
	a, err := post(t, http.DefaultClient, url, key, body)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// newKey returns a random key of UUID strength.
func newKey() string { return deduptype.NewOwnerToken() }

// sendAtOnce sends n identical requests with key from n goroutines released
// together, and returns their answers.
func sendAtOnce(t *testing.T, url, key string, n int) []answer {
	t.Helper()
	answers := make([]answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			a, err := post(t, http.DefaultClient, url, key, order)
			if err != nil {
				t.Error(err)
			}
			answers[i] = a
		}()
	}
	close(start)
	wg.Wait()
	return answers
}
