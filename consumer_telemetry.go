package dedup

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/dedupkit/dedup/internal/otelkit"
	"github.com/dedupkit/dedup/internal/outage"
)

// instrumentation is the name under which the wrapper's spans and metrics are
// reported.
const instrumentation = "github.com/dedupkit/dedup"

// WithTracerProvider makes the wrapper trace each delivery with a span of
// kind consumer, parented by the trace context the message carries (see
// [Messages.TraceCarrier]), else by the context's span. The handler's
// context carries the span. Without it the wrapper creates no spans; pass
// otel.GetTracerProvider() to use the global provider.
func WithTracerProvider(tp trace.TracerProvider) Opt {
	return optFunc(func(c *config) { c.tracerProvider = tp })
}

// WithMeterProvider makes the wrapper record metrics: deliveries by scope
// and outcome (dedup.deliveries), handler durations
// (messaging.process.duration), store call durations by operation
// (dedup.store.duration; the transactional inbox's statements, made in the
// handler's transaction, are not among them), leases lost
// (dedup.leases_lost) and successes whose outcome could not be recorded
// (dedup.outcomes_unrecorded: their effects may run again), and, when
// collected, whether its deliveries are in an outage (dedup.outage: 1 while
// [Wrapper.Health] reports [ErrOutage], else 0). Without it the wrapper
// records none; pass otel.GetMeterProvider() to use the global provider.
func WithMeterProvider(mp metric.MeterProvider) Opt {
	return optFunc(func(c *config) { c.meterProvider = mp })
}

// telemetry is a wrapper's OpenTelemetry instruments. A nil *telemetry
// records nothing and costs nothing: the default.
type telemetry struct {
	scope      attribute.KeyValue
	spanName   string
	tracer     trace.Tracer // nil: no spans
	propagator propagation.TextMapPropagator
	meter      bool // the instruments below are set
	deliveries metric.Int64Counter
	handling   metric.Float64Histogram
	leasesLost metric.Int64Counter
	unrecorded metric.Int64Counter
	storeCalls *storeTimer
	// byOutcome are the deliveries' attribute sets, by Outcome, with
	// "error" last; scopeRecord and scopeAdd the others'. Built once, slices
	// included: building them, or passing a single option, per
	// delivery would allocate.
	byOutcome   [numOutcomes + 1][]metric.AddOption
	scopeRecord []metric.RecordOption
	scopeAdd    []metric.AddOption
}

// numOutcomes counts the values of Outcome up to the last, the zero one
// included.
const numOutcomes = int(OutcomeConflict) + 1

// newTelemetry returns the instruments cfg asks for, nil when none; the
// outage gauge reads health when collected.
func newTelemetry(cfg *config, health *outage.Tracker) (*telemetry, error) {
	tracer, m, ok := otelkit.TracerMeter(cfg.tracerProvider, cfg.meterProvider, instrumentation)
	if !ok {
		return nil, nil
	}
	t := &telemetry{scope: attribute.String("dedup.scope", cfg.scope), spanName: "process " + cfg.scope,
		tracer: tracer, propagator: propagation.TraceContext{}}
	if m == nil {
		return t, nil
	}
	var errs [5]error
	t.deliveries, errs[0] = m.Int64Counter("dedup.deliveries", metric.WithUnit("{delivery}"),
		metric.WithDescription("Deliveries handled, by scope and outcome; outcome \"error\" when the outcome could not be made durable."))
	t.handling, errs[1] = m.Float64Histogram("messaging.process.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of the handler's runs."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10))
	t.leasesLost, errs[2] = m.Int64Counter("dedup.leases_lost", metric.WithUnit("{lease}"),
		metric.WithDescription("Attempts whose claim another worker took over before they settled."))
	t.unrecorded, errs[3] = m.Int64Counter("dedup.outcomes_unrecorded", metric.WithUnit("{delivery}"),
		metric.WithDescription("Deliveries whose handler succeeded but whose outcome the store never recorded: their effects may run again when the event is redelivered."))
	errs[4] = observeOutage(m, health, t.scope)
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	var err error
	if t.storeCalls, err = newStoreTimer(m, t.scope); err != nil {
		return nil, err
	}
	for o := range numOutcomes {
		t.byOutcome[o] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(t.scope, attribute.String("dedup.outcome", Outcome(o).String())))}
	}
	t.byOutcome[numOutcomes] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(t.scope, attribute.String("dedup.outcome", "error")))}
	byScope := metric.WithAttributeSet(attribute.NewSet(t.scope))
	t.scopeRecord, t.scopeAdd = []metric.RecordOption{byScope}, []metric.AddOption{byScope}
	t.meter = true
	return t, nil
}

// start begins the span of a delivery, parented by the message's trace
// context when it carries one.
func (t *telemetry) start(ctx context.Context, carrier propagation.TextMapCarrier, eventID string) trace.Span {
	if t == nil || t.tracer == nil {
		return nil
	}
	if carrier != nil {
		ctx = t.propagator.Extract(ctx, carrier)
	}
	attrs := []attribute.KeyValue{t.scope, attribute.String("messaging.operation.type", "process")}
	if eventID != "" {
		attrs = append(attrs, attribute.String("messaging.message.id", eventID))
	}
	_, span := t.tracer.Start(ctx, t.spanName, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
	return span
}

// end ends a delivery's span with its outcome and counts the outcome.
func (t *telemetry) end(ctx context.Context, span trace.Span, res Result, err error) {
	if t == nil {
		return
	}
	o := int(res.Outcome)
	if err != nil || o < 0 || o >= numOutcomes {
		o = numOutcomes // "error"
	}
	if t.meter {
		t.deliveries.Add(ctx, 1, t.byOutcome[o]...)
	}
	if span == nil {
		return
	}
	outcome := "error"
	if o < numOutcomes {
		outcome = Outcome(o).String()
	}
	span.SetAttributes(attribute.String("dedup.outcome", outcome), attribute.Int("dedup.attempts", res.Attempts))
	if res.Reason != "" {
		span.SetAttributes(attribute.String("dedup.reason", string(res.Reason)))
	}
	if res.Outcome == OutcomeConflict {
		span.SetAttributes(attribute.Bool("dedup.fingerprint_conflict", true))
	}
	switch {
	case err != nil:
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	case res.Err != nil:
		span.RecordError(res.Err)
	}
	span.End()
}

// withTraceContext returns headers with the W3C trace context of ctx's span
// in place of any they held: a dead letter continues its delivery's trace.
func withTraceContext(ctx context.Context, headers []Header) []Header {
	return otelkit.ReplaceTraceContext(ctx, headerFields{}, headers)
}

// headerFields reads and makes a dead letter's headers for otelkit.
type headerFields struct{}

func (headerFields) Key(h Header) string                  { return h.Key }
func (headerFields) Value(h Header) []byte                { return h.Value }
func (headerFields) Make(key string, value []byte) Header { return Header{Key: key, Value: value} }

// handled records one run of the handler.
func (t *telemetry) handled(ctx context.Context, began time.Time) {
	if t == nil || !t.meter {
		return
	}
	t.handling.Record(ctx, time.Since(began).Seconds(), t.scopeRecord...)
}

// leaseLost counts an attempt whose claim was taken over.
func (t *telemetry) leaseLost(ctx context.Context) {
	if t == nil || !t.meter {
		return
	}
	t.leasesLost.Add(ctx, 1, t.scopeAdd...)
}

func (t *telemetry) outcomeUnrecorded(ctx context.Context) {
	if t == nil || !t.meter {
		return
	}
	t.unrecorded.Add(ctx, 1, t.scopeAdd...)
}

// observeOutage registers dedup.outage, observed when the metrics are
// collected: 1 while health reports an outage, else 0. The registration
// lasts as long as the meter provider: a wrapper has no end.
func observeOutage(m metric.Meter, health *outage.Tracker, scope attribute.KeyValue) error {
	byScope := metric.WithAttributeSet(attribute.NewSet(scope))
	_, err := m.Int64ObservableGauge("dedup.outage", metric.WithUnit("{outage}"),
		metric.WithDescription("1 while the wrapper's deliveries have kept failing to be made durable (store or dead-letter sink failing) for the outage threshold or longer, else 0."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			var v int64
			if health.Health() != nil {
				v = 1
			}
			o.Observe(v, byScope)
			return nil
		}))
	return err
}
