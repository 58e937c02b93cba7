package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
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

// lossyStore is a real MemoryStore whose Complete fails, ending the
// delivery's context at its first failure, as a transport does when it may
// give the message to another consumer (a partition revoked).
type lossyStore struct {
	dedup.Store
	release context.CancelFunc
}

var errLost = errors.New("store unreachable")

func (s *lossyStore) Complete(context.Context, dedup.Key, string, []byte, time.Duration) error {
	s.release()
	return errLost
}

// cycle runs a cycle of the example's workload (its sink's outage last),
// scraped while the outage lasts and once it is over: dedup.outage reads 1,
// then 0.
func cycle(t *testing.T, exp *exporter) {
	t.Helper()
	wl, err := newWorkload(exp.mp, quiet(), time.Nanosecond)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range cycleRounds + 1 {
		if err := wl.round(ctx, i); err != nil {
			t.Fatal(err)
		}
		if i == cycleRounds-1 {
			if v, ok := exp.scrape(t).value("dedup_outage", "dedup_scope", wl.consumer.Scope()); v != 1 {
				t.Errorf("dedup_outage during the sink's outage: %v (found: %v), want 1", v, ok)
			}
		}
	}
	if v, ok := exp.scrape(t).value("dedup_outage", "dedup_scope", wl.consumer.Scope()); !ok || v != 0 {
		t.Errorf("dedup_outage after the outage: %v (found: %v), want 0", v, ok)
	}
}

// loseOutcome delivers an event whose handler succeeds but whose outcome
// the store never records, and returns the consumer's scope.
func loseOutcome(t *testing.T, exp *exporter) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	scope := dedup.Scope("metrics-example", "lost-"+runID())
	w, err := dedup.Wrap(&lossyStore{Store: dedup.NewMemoryStore(), release: cancel}, orders,
		func(context.Context, order) error { return nil },
		dedup.WithScope(scope), dedup.WithSink(dedup.NewMemorySink()), dedup.WithMeterProvider(exp.mp), dedup.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Handle(ctx, order{ID: "lost-1", Body: "b"}); !errors.Is(err, errLost) {
		t.Fatalf("a delivery whose completion failed: %v, want %v", err, errLost)
	}
	return scope
}

// startRelay runs an outbox relay, until the test ends, publishing to an
// in-process Kafka cluster, and returns once its events are published, one
// of them to a topic that does not exist (failed for good). Its backlog
// gauges are read only while it runs.
func startRelay(t *testing.T, exp *exporter) {
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
	t.Cleanup(kc.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.ProducerLinger(0), kgo.UnknownTopicRetries(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
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
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := ob.Stats(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		if st.Pending == 0 && st.Failed == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the relay did not settle its events in 60 s: %+v", st)
		}
	}
}
