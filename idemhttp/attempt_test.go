package idemhttp_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/idemhttp"
)

// blipStore fails its first fails completions, and every claim while down,
// as a store briefly unreachable.
type blipStore struct {
	dedup.Store
	fails     int32
	completes atomic.Int32
	down      atomic.Bool
}

func (s *blipStore) Complete(ctx context.Context, key dedup.Key, owner string, result []byte, ttl time.Duration) error {
	if s.completes.Add(1) <= s.fails {
		return errors.New("idemhttp test: store unreachable")
	}
	return s.Store.Complete(ctx, key, owner, result, ttl)
}

func (s *blipStore) Claim(ctx context.Context, req dedup.ClaimRequest) (dedup.Claim, error) {
	if s.down.Load() {
		return dedup.Claim{}, errors.New("idemhttp test: store unreachable")
	}
	return s.Store.Claim(ctx, req)
}

// TestCompletionOutlastingALeaseIsStored: the store failing to record an
// answer for longer than the lease does not leave the operation to run
// again: the completion is tried again, as a consumer's is, for up to ten
// leases; the answer is stored and replayed.
func TestCompletionOutlastingALeaseIsStored(t *testing.T) {
	store := &blipStore{Store: dedup.NewMemoryStore(), fails: 4}
	const lease = 200 * time.Millisecond
	pay := &payments{}
	srv := serve(t, newMiddleware(t, store, idemhttp.WithLease(lease)).Wrap(pay))
	key := newKey()
	start := time.Now()
	first := mustPost(t, srv.URL, key, order)
	// The waits between the tries alone (50, 100, 200 and 400 ms) outlast
	// the lease: a completion tried for one lease would have given up.
	if took := time.Since(start); first.status != http.StatusCreated || took < lease {
		t.Fatalf("first: %d %q after %v", first.status, first.body, took)
	}
	if n := store.completes.Load(); n != 5 {
		t.Errorf("%d completions, want 5", n)
	}
	rec, err := store.Get(context.Background(), dedup.Key{Scope: "payments-api", EventID: key})
	if err != nil || rec.Status != dedup.StatusSucceeded || len(rec.Result) == 0 {
		t.Fatalf("record %+v %v, want the answer stored", rec, err)
	}
	again := mustPost(t, srv.URL, key, order)
	if !again.replayed() || again.body != first.body || pay.charges.Load() != 1 {
		t.Errorf("retry: %d replayed=%v %q after %d charges", again.status, again.replayed(), again.body, pay.charges.Load())
	}
}

// TestStoreOutageIsReported: the store's failures feed the middleware's
// outage tracker, which Health reports past WithOutageThreshold, until the
// store records an answer again.
func TestStoreOutageIsReported(t *testing.T) {
	store := &blipStore{Store: dedup.NewMemoryStore()}
	m := newMiddleware(t, store, idemhttp.WithOutageThreshold(time.Millisecond))
	srv := serve(t, m.Wrap(&payments{}))
	if err := m.Health(); err != nil {
		t.Fatalf("health before any request: %v", err)
	}
	store.down.Store(true)
	if a := mustPost(t, srv.URL, newKey(), order); a.status != http.StatusServiceUnavailable || a.problemType() != problem(idemhttp.ProblemStore) {
		t.Fatalf("store down: %d %q", a.status, a.body)
	}
	time.Sleep(5 * time.Millisecond) // past the threshold since the failure
	if err := m.Health(); !errors.Is(err, dedup.ErrOutage) {
		t.Errorf("health while the store is down: %v, want ErrOutage", err)
	}
	store.down.Store(false)
	if a := mustPost(t, srv.URL, newKey(), order); a.status != http.StatusCreated {
		t.Fatalf("store back: %d %q", a.status, a.body)
	}
	if err := m.Health(); err != nil {
		t.Errorf("health once the store is back: %v", err)
	}
}

// TestTxNotStoredAnswerRecordsTheFailure: in transactional mode, an answer
// that is not stored rolls the handler's rows back and records the failed
// attempt in the same transaction, as the store mode records it: the key
// stays retryable, its last error said.
func TestTxNotStoredAnswerRecordsTheFailure(t *testing.T) {
	store, pool := postgresStore(t)
	charges := chargesTable(t, pool)
	status := http.StatusServiceUnavailable
	m, err := idemhttp.NewTx(store, pool, idemhttp.WithScope("payments-api"))
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, m.Wrap(txCharge(charges, &status))).URL
	key := newKey()
	if a := mustPost(t, url, key, order); a.status != http.StatusServiceUnavailable {
		t.Fatalf("first: %d %q", a.status, a.body)
	}
	rec, err := store.Get(context.Background(), dedup.Key{Scope: "payments-api", EventID: key})
	if err != nil || rec.Status != dedup.StatusFailedRetryable || rec.LastError != "status 503" || rec.Attempts != 1 {
		t.Fatalf("record %+v %v, want a failed attempt", rec, err)
	}
	if n := countRows(t, pool, charges); n != 0 {
		t.Errorf("%d rows after a 503, want 0", n)
	}
	status = 0
	if a := mustPost(t, url, key, order); a.status != http.StatusCreated || a.replayed() {
		t.Errorf("retry: %d replayed=%v", a.status, a.replayed())
	}
	if n := countRows(t, pool, charges); n != 1 {
		t.Errorf("%d rows, want 1", n)
	}
}
