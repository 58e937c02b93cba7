package deploy_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptest"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/idemhttp"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/kafkaoutbox"
)

// exporter is an OpenTelemetry meter provider exporting to Prometheus, its
// /metrics served over real HTTP.
type exporter struct {
	mp  *sdkmetric.MeterProvider
	srv *httptest.Server
}

func newExporter(t *testing.T) *exporter {
	t.Helper()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(func() {
		srv.Close()
		_ = mp.Shutdown(context.Background())
	})
	return &exporter{mp: mp, srv: srv}
}

// scrape fetches /metrics and parses it.
func (e *exporter) scrape(t *testing.T) exposition {
	t.Helper()
	resp, err := http.Get(e.srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	x, err := parseExposition(string(b))
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func runID() string {
	return strconv.FormatInt(time.Now().UnixNano(), 36) + deduptype.NewOwnerToken()[:4]
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// order is a consumed message.
type order struct{ ID, Body string }

var orders = dedup.Messages[order]{
	EventID:    func(o order) (string, error) { return o.ID, nil },
	Payload:    func(o order) []byte { return []byte(o.Body) },
	DeadLetter: func(o order) dedup.DeadLetter { return dedup.DeadLetter{Payload: []byte(o.Body)} },
}

// lossyStore is a real MemoryStore whose Complete fails while lose is set,
// ending the delivery's context at its first failure, as a transport does
// when it may give the message to another consumer (a partition revoked).
type lossyStore struct {
	dedup.Store
	lose    atomic.Bool
	release atomic.Pointer[context.CancelFunc]
}

var errLost = errors.New("store unreachable")

func (s *lossyStore) Complete(ctx context.Context, k dedup.Key, owner string, result []byte, ttl time.Duration) error {
	if s.lose.Load() {
		if c := s.release.Load(); c != nil {
			(*c)()
		}
		return errLost
	}
	return s.Store.Complete(ctx, k, owner, result, ttl)
}

// consume runs a consumer's deliveries through a wrapper as a transport
// would: events processed and redelivered, one failing once, poison events
// dead-lettered, an outage of the dead-letter sink (scraped while it
// lasts: dedup.outage must read 1) and a success whose outcome is lost.
// It returns the scope.
func consume(t *testing.T, exp *exporter) string {
	t.Helper()
	scope := "deploy-" + runID() + "/orders"
	store, sink := &lossyStore{Store: dedup.NewMemoryStore()}, deduptest.NewFailingSink()
	var mu sync.Mutex
	failed := map[string]bool{}
	w, err := dedup.Wrap(store, orders, func(_ context.Context, o order) error {
		switch {
		case strings.HasPrefix(o.ID, "poison"):
			return dedup.Permanent(errors.New("unsupported order"))
		case strings.HasPrefix(o.ID, "flaky"):
			mu.Lock()
			defer mu.Unlock()
			if !failed[o.ID] {
				failed[o.ID] = true
				return errors.New("downstream busy")
			}
		}
		return nil
	}, dedup.WithScope(scope), dedup.WithSink(sink), dedup.WithMeterProvider(exp.mp), dedup.WithLogger(quiet()),
		dedup.WithOutageThreshold(50*time.Millisecond), dedup.WithBackoff(dedup.ExponentialBackoff(time.Millisecond, 5*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	settle := func(o order, want dedup.Outcome) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			res, err := w.Handle(ctx, o)
			if err == nil && res.Settled() {
				if res.Outcome != want {
					t.Fatalf("%s: outcome %v, want %v", o.ID, res.Outcome, want)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not settled after 30 s: %v %v", o.ID, res, err)
			}
		}
	}
	for i := range 5 {
		settle(order{ID: "ok-" + strconv.Itoa(i), Body: "b"}, dedup.OutcomeProcessed)
	}
	settle(order{ID: "ok-0", Body: "b"}, dedup.OutcomeDuplicate)
	settle(order{ID: "flaky-1", Body: "b"}, dedup.OutcomeProcessed)
	settle(order{ID: "poison-1", Body: "b"}, dedup.OutcomeDeadLettered)

	// An outage: the sink refuses letters until Health reports it.
	sink.FailWith(errors.New("dead-letter queue down"))
	for deadline := time.Now().Add(30 * time.Second); w.Health() == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no outage after 30 s of a failing sink")
		}
		_, _ = w.Handle(ctx, order{ID: "poison-2", Body: "b"})
	}
	if v, ok := exp.scrape(t).value("dedup_outage", "dedup_scope", scope); !ok || v != 1 {
		t.Errorf("dedup_outage during the outage: %v (found: %v), want 1", v, ok)
	}
	sink.FailWith(nil)
	settle(order{ID: "poison-2", Body: "b"}, dedup.OutcomeDeadLettered)

	// A success whose outcome the store never records.
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	store.release.Store(&cancel)
	store.lose.Store(true)
	if _, err := w.Handle(lctx, order{ID: "lost-1", Body: "b"}); !errors.Is(err, errLost) {
		t.Fatalf("a delivery whose completion failed: %v, want %v", err, errLost)
	}
	store.lose.Store(false)
	return scope
}

// serveHTTP makes requests through an idemhttp middleware: executions, a
// replay and a key reused with another body (a conflict).
func serveHTTP(t *testing.T, exp *exporter) {
	t.Helper()
	mw, err := idemhttp.New(dedup.NewMemoryStore(), idemhttp.WithScope("deploy-"+runID()+"/payments"),
		idemhttp.WithMeterProvider(exp.mp), idemhttp.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"status":"paid"}`)
	})))
	defer srv.Close()
	key := outbox.NewID()
	for _, tc := range []struct {
		body     string
		status   int
		replayed string
	}{
		{`{"amount":1}`, http.StatusCreated, ""},
		{`{"amount":1}`, http.StatusCreated, "true"},
		{`{"amount":2}`, http.StatusUnprocessableEntity, ""},
	} {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.DefaultHeader, key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != tc.status || resp.Header.Get(idemhttp.ReplayHeader) != tc.replayed {
			t.Fatalf("POST %s: %d replayed %q, want %d replayed %q", tc.body, resp.StatusCode,
				resp.Header.Get(idemhttp.ReplayHeader), tc.status, tc.replayed)
		}
	}
	http.DefaultClient.CloseIdleConnections()
}

// relay runs an outbox relay publishing to an in-process Kafka cluster
// until its events are published, one of them to a topic that does not
// exist (failed for good), and scrapes while it runs: the backlog gauges
// are read only then. It returns that scrape.
func relay(t *testing.T, exp *exporter) exposition {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	table := "outbox_deploy_" + runID()
	ob, err := outbox.New(outbox.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	topic := "orders-" + runID()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.ProducerLinger(0), kgo.UnknownTopicRetries(1))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pub, err := kafkaoutbox.NewPublisher(cl)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	evs := []outbox.Event{{Destination: "missing-" + runID(), Payload: []byte("lost")}}
	for i := range 5 {
		evs = append(evs, outbox.Event{Destination: topic, Payload: []byte("order " + strconv.Itoa(i))})
	}
	if _, err := ob.Add(ctx, tx, evs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := outbox.NewRelay(ob, pool.Config(), pub, outbox.WithMeterProvider(exp.mp), outbox.WithLogger(quiet()),
		outbox.WithPollInterval(20*time.Millisecond), outbox.WithBackoff(dedup.ExponentialBackoff(5*time.Millisecond, 20*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	}()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := ob.Stats(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		if st.Pending == 0 && st.Failed == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the relay did not settle its events in 60 s: %+v", st)
		}
	}
	return exp.scrape(t)
}
