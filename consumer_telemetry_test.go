package dedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptest"
)

// tracedEvent is a message carrying W3C trace context headers, as a Kafka
// record or an SQS message from a traced producer does.
type tracedEvent struct {
	ID      string
	Body    string
	Headers propagation.MapCarrier
}

var tracedEvents = dedup.Messages[tracedEvent]{
	EventID:      func(e tracedEvent) (string, error) { return e.ID, nil },
	Payload:      func(e tracedEvent) []byte { return []byte(e.Body) },
	DeadLetter:   func(e tracedEvent) dedup.DeadLetter { return dedup.DeadLetter{Payload: []byte(e.Body)} },
	TraceCarrier: func(e tracedEvent) propagation.TextMapCarrier { return e.Headers },
}

// telemetry is an in-memory OpenTelemetry SDK: finished spans and a
// metric reader.
type telemetry struct {
	spans  *tracetest.InMemoryExporter
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func newTelemetry(t *testing.T) *telemetry {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	return &telemetry{spans: spans, tp: tp, reader: reader, mp: mp}
}

// produce returns a message whose headers carry a new producer span's
// context, and that span's context.
func (tel *telemetry) produce(id, body string) (tracedEvent, trace.SpanContext) {
	ctx, span := tel.tp.Tracer("producer").Start(context.Background(), "send")
	defer span.End()
	h := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, h)
	return tracedEvent{ID: id, Body: body, Headers: h}, span.SpanContext()
}

// deliveries returns the wrapper's spans, by event ID, in order of ending.
func (tel *telemetry) deliveries() map[string][]sdktrace.ReadOnlySpan {
	out := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range tel.spans.GetSpans().Snapshots() {
		if s.InstrumentationScope().Name != "github.com/dedupkit/dedup" {
			continue
		}
		id := attr(s.Attributes(), "messaging.message.id").AsString()
		out[id] = append(out[id], s)
	}
	return out
}

// counter returns the sum of the counter name over its attributes.
func (tel *telemetry) counter(t *testing.T, name string) int64 {
	var rm metricdata.ResourceMetrics
	require.NoError(t, tel.reader.Collect(context.Background(), &rm))
	var sum int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if data, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, p := range data.DataPoints {
					sum += p.Value
				}
			}
		}
	}
	return sum
}

// counts returns dedup.deliveries by outcome, and how many handler runs the
// duration histogram saw.
func (tel *telemetry) counts(t *testing.T) (map[string]int64, uint64) {
	outcomes, runs, _ := tel.collect(t)
	return outcomes, runs
}

// collect returns dedup.deliveries by outcome, how many handler runs the
// duration histogram saw, and the store calls timed, by operation.
func (tel *telemetry) collect(t *testing.T) (map[string]int64, uint64, map[string]uint64) {
	var rm metricdata.ResourceMetrics
	require.NoError(t, tel.reader.Collect(context.Background(), &rm))
	outcomes := map[string]int64{}
	storeCalls := map[string]uint64{}
	var runs uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				if m.Name == "dedup.deliveries" {
					for _, p := range data.DataPoints {
						v, _ := p.Attributes.Value("dedup.outcome")
						outcomes[v.AsString()] += p.Value
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range data.DataPoints {
					switch m.Name {
					case "messaging.process.duration":
						runs += p.Count
					case "dedup.store.duration":
						op, _ := p.Attributes.Value("dedup.store.operation")
						storeCalls[op.AsString()] += p.Count
					}
				}
			}
		}
	}
	return outcomes, runs, storeCalls
}

func attr(kvs []attribute.KeyValue, key string) attribute.Value {
	for _, kv := range kvs {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// Each delivery is a span, child of the producer's span read from the
// message's headers; the handler's context carries it; its outcome and
// attempts are attributes; the outcomes are counted by scope.
func TestDeliverySpansAndMetrics(t *testing.T) {
	tel := newTelemetry(t)
	sink := dedup.NewMemorySink()
	handlerSpans := map[string]trace.SpanID{}
	w, err := dedup.Wrap(dedup.NewMemoryStore(), tracedEvents, func(ctx context.Context, e tracedEvent) error {
		handlerSpans[e.ID] = trace.SpanContextFromContext(ctx).SpanID()
		if e.Body == "poison" {
			return dedup.Permanent(errors.New("bad order"))
		}
		return nil
	}, dedup.WithScope("orders/ship"), dedup.WithSink(sink),
		dedup.WithTracerProvider(tel.tp), dedup.WithMeterProvider(tel.mp))
	require.NoError(t, err)
	ctx := context.Background()

	a, aParent := tel.produce("a", "ok")
	for range 2 { // a redelivery
		_, err := w.Handle(ctx, a)
		require.NoError(t, err)
	}
	p, pParent := tel.produce("p", "poison")
	_, err = w.Handle(ctx, p)
	require.NoError(t, err)
	b, bParent := tel.produce("b", "ok")
	c, cParent := tel.produce("c", "ok")
	require.NoError(t, w.HandleBatch(ctx, []tracedEvent{b, c, b}, func(int, dedup.Result, error) bool { return true }))

	spans := tel.deliveries()
	for id, parent := range map[string]trace.SpanContext{"a": aParent, "p": pParent, "b": bParent, "c": cParent} {
		require.NotEmpty(t, spans[id], id)
		for _, s := range spans[id] {
			require.Equal(t, parent.TraceID(), s.SpanContext().TraceID(), "%s: in the producer's trace", id)
			require.Equal(t, parent.SpanID(), s.Parent().SpanID(), "%s: child of the producer's span", id)
			require.Equal(t, trace.SpanKindConsumer, s.SpanKind())
			require.Equal(t, "process orders/ship", s.Name())
			require.Equal(t, "orders/ship", attr(s.Attributes(), "dedup.scope").AsString())
		}
	}
	outcome := func(id string, i int) string { return attr(spans[id][i].Attributes(), "dedup.outcome").AsString() }
	require.Len(t, spans["a"], 2)
	require.Equal(t, "processed", outcome("a", 0))
	require.Equal(t, int64(1), attr(spans["a"][0].Attributes(), "dedup.attempts").AsInt64())
	require.Equal(t, "duplicate", outcome("a", 1))
	require.Equal(t, spans["a"][0].SpanContext().SpanID(), handlerSpans["a"], "the handler's context carries the delivery's span")
	require.Equal(t, "dead-lettered", outcome("p", 0))
	require.Equal(t, string(dedup.ReasonPermanent), attr(spans["p"][0].Attributes(), "dedup.reason").AsString())
	require.Len(t, spans["p"][0].Events(), 1, "the handler's error recorded")
	require.Len(t, spans["b"], 2)
	require.Equal(t, "processed", outcome("b", 0))
	require.Equal(t, "duplicate", outcome("b", 1))
	require.Equal(t, spans["b"][0].SpanContext().SpanID(), handlerSpans["b"])
	require.Equal(t, "processed", outcome("c", 0))

	outcomes, runs, storeCalls := tel.collect(t)
	require.Equal(t, map[string]int64{"processed": 3, "duplicate": 2, "dead-lettered": 1}, outcomes)
	require.Equal(t, uint64(4), runs, "a, p, b and c ran once each")
	require.Equal(t, uint64(3), storeCalls["claim"], "a twice and p, one by one")
	require.Equal(t, uint64(1), storeCalls["claim_batch"], "b and c in one call")
	require.Equal(t, uint64(1), storeCalls["complete"], "a")
	require.Equal(t, uint64(1), storeCalls["complete_batch"], "b and c in one write")
}

// A delivery that could not be made durable ends its span with an error
// status and counts as outcome "error"; a batch that stops early ends the
// spans of the messages it did not reach.
func TestDeliverySpansOnStoreFailure(t *testing.T) {
	tel := newTelemetry(t)
	sink := deduptest.NewFailingSink()
	sink.FailWith(errors.New("dead-letter topic unavailable"))
	w, err := dedup.Wrap(dedup.NewMemoryStore(), tracedEvents, func(context.Context, tracedEvent) error {
		return dedup.Permanent(errors.New("bad order"))
	}, dedup.WithScope("orders/ship"), dedup.WithSink(sink), dedup.WithTracerProvider(tel.tp), dedup.WithMeterProvider(tel.mp))
	require.NoError(t, err)
	x, _ := tel.produce("x", "poison")
	y, _ := tel.produce("y", "poison")
	require.NoError(t, w.HandleBatch(context.Background(), []tracedEvent{x, y}, func(_ int, _ dedup.Result, err error) bool {
		require.Error(t, err)
		return false // stop at the first: y is not reached
	}))

	spans := tel.deliveries()
	require.Len(t, spans["x"], 1)
	require.Equal(t, "error", attr(spans["x"][0].Attributes(), "dedup.outcome").AsString())
	require.Equal(t, "Error", spans["x"][0].Status().Code.String())
	require.Len(t, spans["y"], 1, "ended, not leaked")
	require.Equal(t, "unsettled", attr(spans["y"][0].Attributes(), "dedup.outcome").AsString())
	outcomes, _ := tel.counts(t)
	require.Equal(t, map[string]int64{"error": 1}, outcomes)
}

// Timing the store keeps it a BatchCompleter: with batch completion a
// batch's successes are still completed in one call.
func TestStoreTimingKeepsBatchCompletion(t *testing.T) {
	tel := newTelemetry(t)
	w, err := dedup.Wrap(dedup.NewMemoryStore(), tracedEvents, func(context.Context, tracedEvent) error { return nil },
		dedup.WithScope("orders/ship"), dedup.WithSink(dedup.NewMemorySink()),
		dedup.WithBatchCompletion(time.Second), dedup.WithMeterProvider(tel.mp))
	require.NoError(t, err)
	var batch []tracedEvent
	for _, id := range []string{"a", "b", "c"} {
		batch = append(batch, tracedEvent{ID: id, Body: "ok"})
	}
	require.NoError(t, w.HandleBatch(context.Background(), batch, func(_ int, res dedup.Result, err error) bool {
		require.NoError(t, err)
		require.Equal(t, dedup.OutcomeProcessed, res.Outcome)
		return true
	}))
	_, _, storeCalls := tel.collect(t)
	require.Equal(t, map[string]uint64{"claim_batch": 1, "complete_batch": 1}, storeCalls)
}
