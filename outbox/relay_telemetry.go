package outbox

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/dedupkit/dedup/internal/otelkit"
)

// instrumentation is the name under which the relay's spans and metrics are
// reported.
const instrumentation = "github.com/dedupkit/dedup/outbox"

// WithTracerProvider makes the relay trace each pass that found events,
// with a child span of kind producer for its publish, linked to the trace
// of each event's writer. Without it the relay creates no spans; pass
// otel.GetTracerProvider() to use the global provider.
func WithTracerProvider(tp trace.TracerProvider) RelayOpt {
	return relayOptFunc(func(c *relayConfig) { c.tracerProvider = tp })
}

// WithMeterProvider makes the relay record metrics: events published
// (outbox.events.published), publish failures (outbox.publish.failures),
// events failed for good (outbox.events.failed), and, read from the table
// when collected, pending events (outbox.pending) and the age of the
// oldest (outbox.pending.age). The relay then opens one more connection,
// for those reads. Without it the relay records none.
func WithMeterProvider(mp metric.MeterProvider) RelayOpt {
	return relayOptFunc(func(c *relayConfig) { c.meterProvider = mp })
}

// relayTelemetry is a relay's OpenTelemetry instruments; nil records
// nothing.
type relayTelemetry struct {
	table     attribute.KeyValue
	byTable   metric.MeasurementOption
	tracer    trace.Tracer // nil: no spans
	meter     metric.Meter // nil: no metrics
	published metric.Int64Counter
	failures  metric.Int64Counter
	failed    metric.Int64Counter
	pending   metric.Int64ObservableGauge
	age       metric.Float64ObservableGauge
}

func newRelayTelemetry(cfg *relayConfig, table string) (*relayTelemetry, error) {
	tracer, m, ok := otelkit.TracerMeter(cfg.tracerProvider, cfg.meterProvider, instrumentation)
	if !ok {
		return nil, nil
	}
	t := &relayTelemetry{table: attribute.String("outbox.table", table), tracer: tracer}
	t.byTable = metric.WithAttributeSet(attribute.NewSet(t.table))
	if m == nil {
		return t, nil
	}
	var errs [5]error
	t.published, errs[0] = m.Int64Counter("outbox.events.published", metric.WithUnit("{event}"),
		metric.WithDescription("Events the broker acknowledged."))
	t.failures, errs[1] = m.Int64Counter("outbox.publish.failures", metric.WithUnit("{event}"),
		metric.WithDescription("Publishes the broker refused or that failed; the event is retried after a backoff or failed."))
	t.failed, errs[2] = m.Int64Counter("outbox.events.failed", metric.WithUnit("{event}"),
		metric.WithDescription("Events failed for good: requeue them once the cause is fixed."))
	t.pending, errs[3] = m.Int64ObservableGauge("outbox.pending", metric.WithUnit("{event}"),
		metric.WithDescription("Events waiting to be published."))
	t.age, errs[4] = m.Float64ObservableGauge("outbox.pending.age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest event waiting to be published."))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	t.meter = m
	return t, nil
}

// observeBacklog reads the backlog from the table each time the metrics are
// collected, until the returned function is called.
func (t *relayTelemetry) observeBacklog(pool *pgxpool.Pool, query string) (stop func()) {
	if t == nil || t.meter == nil {
		return func() {}
	}
	reg, err := t.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		var n int64
		var age float64
		if err := pool.QueryRow(ctx, query).Scan(&n, &age); err != nil {
			return err
		}
		o.ObserveInt64(t.pending, n, t.byTable)
		o.ObserveFloat64(t.age, age, t.byTable)
		return nil
	}, t.pending, t.age)
	if err != nil {
		return func() {}
	}
	return func() { _ = reg.Unregister() }
}

// startPass begins the span of a pass that claimed events.
func (t *relayTelemetry) startPass(ctx context.Context, events []Event) (context.Context, trace.Span) {
	if t == nil || t.tracer == nil {
		return ctx, nil
	}
	return t.tracer.Start(ctx, "outbox relay pass", trace.WithAttributes(t.table, attribute.Int("outbox.events", len(events))))
}

// startPublish begins the span of a pass's publish, linked to the trace
// each event was written in.
func (t *relayTelemetry) startPublish(ctx context.Context, events []Event) (context.Context, trace.Span) {
	if t == nil || t.tracer == nil {
		return ctx, nil
	}
	var links []trace.Link
	for i := range events {
		if sc := otelkit.SpanContext(headerFields{}, events[i].Headers); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	return t.tracer.Start(ctx, "publish", trace.WithSpanKind(trace.SpanKindProducer), trace.WithLinks(links...),
		trace.WithAttributes(t.table, attribute.String("messaging.operation.type", "send"),
			attribute.Int("messaging.batch.message_count", len(events))))
}

// endPublish records a publish's results and ends its span.
func (t *relayTelemetry) endPublish(ctx context.Context, span trace.Span, sent int, f *failures) {
	if t == nil {
		return
	}
	if t.meter != nil {
		t.published.Add(ctx, int64(sent), t.byTable)
		t.failures.Add(ctx, int64(len(f.seqs)), t.byTable)
	}
	if span == nil {
		return
	}
	span.SetAttributes(attribute.Int("outbox.sent", sent), attribute.Int("outbox.publish_failures", len(f.seqs)))
	if len(f.seqs) > 0 {
		span.SetStatus(codes.Error, f.texts[0])
	}
	span.End()
}

// failedForGood counts the events of a committed pass that are failed now.
func (t *relayTelemetry) failedForGood(ctx context.Context, n int) {
	if t == nil || t.meter == nil || n == 0 {
		return
	}
	t.failed.Add(ctx, int64(n), t.byTable)
}

// endPass ends a pass's span.
func (t *relayTelemetry) endPass(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
