package idemhttp_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/idemhttp"
)

// Each request behind the middleware is a span, carried by the handler's
// context, saying whether it was replayed and its status; the answers are
// counted by replayed and status. A replay and a refusal from the replay
// cache are recorded as those from the store are.
func TestRequestSpansAndMetrics(t *testing.T) {
	t.Run("cache", func(t *testing.T) {
		testRequestSpansAndMetrics(t, idemhttp.WithReplayCache(idemhttp.DefaultReplayCacheBytes), 2)
	})
	t.Run("no cache", func(t *testing.T) { testRequestSpansAndMetrics(t, idemhttp.WithReplayCache(0), 4) })
}

// testRequestSpansAndMetrics runs TestRequestSpansAndMetrics with cache,
// whose store calls are storeCalls: a claim and a completion for the first
// request, and a claim for each retry the cache does not answer.
func testRequestSpansAndMetrics(t *testing.T, cache idemhttp.Opt, storeCalls int64) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	pay := &payments{}
	var handlerSpan trace.SpanID
	calls := new(atomic.Int64)
	m := newMiddleware(t, countingStore{dedup.NewMemoryStore(), calls}, idemhttp.WithTracerProvider(tp), idemhttp.WithMeterProvider(mp), cache)
	srv := serve(t, m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handlerSpan = trace.SpanContextFromContext(r.Context()).SpanID()
		pay.ServeHTTP(w, r)
	})))

	key := newKey()
	require.Equal(t, http.StatusCreated, mustPost(t, srv.URL, key, `{"amount":10}`).status)
	require.True(t, mustPost(t, srv.URL, key, `{"amount":10}`).replayed())
	require.Equal(t, http.StatusUnprocessableEntity, mustPost(t, srv.URL, key, `{"amount":99}`).status)
	require.Equal(t, http.StatusBadRequest, mustPost(t, srv.URL, "", `{"amount":10}`).status)
	require.Equal(t, storeCalls, calls.Load())

	got := spans.GetSpans().Snapshots()
	require.Len(t, got, 4)
	type answer struct {
		replayed bool
		status   int64
	}
	var answers []answer
	for _, s := range got {
		a := answer{}
		for _, kv := range s.Attributes() {
			switch kv.Key {
			case "idempotency.replayed":
				a.replayed = kv.Value.AsBool()
			case "http.response.status_code":
				a.status = kv.Value.AsInt64()
			}
		}
		answers = append(answers, a)
	}
	require.Equal(t, []answer{{false, 201}, {true, 201}, {false, 422}, {false, 400}}, answers)
	require.Equal(t, got[0].SpanContext().SpanID(), handlerSpan, "the handler's context carries the request's span")

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	counts := map[answer]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, metric := range sm.Metrics {
			if metric.Name != "idemhttp.requests" {
				continue
			}
			for _, p := range metric.Data.(metricdata.Sum[int64]).DataPoints {
				replayed, _ := p.Attributes.Value(attribute.Key("idempotency.replayed"))
				status, _ := p.Attributes.Value(attribute.Key("http.response.status_code"))
				counts[answer{replayed.AsBool(), status.AsInt64()}] += p.Value
			}
		}
	}
	require.Equal(t, map[answer]int64{{false, 201}: 1, {true, 201}: 1, {false, 422}: 1, {false, 400}: 1}, counts)
	require.Equal(t, int64(1), pay.charges.Load())
}
