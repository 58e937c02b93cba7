package idemhttp

import (
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/dedupkit/dedup/internal/otelkit"
)

// instrumentation is the name under which the middleware's spans and
// metrics are reported.
const instrumentation = "github.com/dedupkit/dedup/idemhttp"

// WithTracerProvider makes the middleware trace each request with a span,
// a child of the request context's span (an HTTP server instrumentation's),
// that the handler's context carries: an outbox event written by the handler
// continues its trace. Its attributes say whether the answer was replayed
// and its status. Without it the middleware creates no spans; pass
// otel.GetTracerProvider() to use the global provider.
func WithTracerProvider(tp trace.TracerProvider) Opt {
	return optFunc(func(c *config) { c.tracerProvider = tp })
}

// WithMeterProvider makes the middleware count its answers
// (idemhttp.requests) by scope, by whether they were replayed and by
// status code: executions, replays, and rejections (4xx and 5xx the
// middleware or the handler answered). Without it the middleware records
// none.
func WithMeterProvider(mp metric.MeterProvider) Opt {
	return optFunc(func(c *config) { c.meterProvider = mp })
}

// httpTelemetry is a middleware's OpenTelemetry instruments; nil records
// nothing.
type httpTelemetry struct {
	scope    attribute.KeyValue
	tracer   trace.Tracer // nil: no spans
	requests metric.Int64Counter
	metered  bool
}

func newHTTPTelemetry(cfg *config) (*httpTelemetry, error) {
	tracer, meter, ok := otelkit.TracerMeter(cfg.tracerProvider, cfg.meterProvider, instrumentation)
	if !ok {
		return nil, nil
	}
	t := &httpTelemetry{scope: attribute.String("dedup.scope", cfg.scope), tracer: tracer}
	if meter != nil {
		var err error
		t.requests, err = meter.Int64Counter("idemhttp.requests", metric.WithUnit("{request}"),
			metric.WithDescription("Requests answered behind an Idempotency-Key middleware, by replayed and status code."))
		if err != nil {
			return nil, err
		}
		t.metered = true
	}
	return t, nil
}

// instrument returns h traced and counted, or h itself when t records
// nothing.
func (t *httpTelemetry) instrument(h http.Handler) http.Handler {
	if t == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		var span trace.Span
		if t.tracer != nil {
			ctx, span = t.tracer.Start(ctx, "idempotency "+r.Method, trace.WithAttributes(t.scope))
			defer span.End()
			r = r.WithContext(ctx)
		}
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		status := sw.status
		if status == 0 {
			status = http.StatusOK
		}
		replayed := sw.Header().Get(ReplayHeader) == "true"
		attrs := []attribute.KeyValue{attribute.Bool("idempotency.replayed", replayed), attribute.Int("http.response.status_code", status)}
		if span != nil {
			span.SetAttributes(attrs...)
		}
		if t.metered {
			t.requests.Add(ctx, 1, metric.WithAttributes(append(attrs, t.scope, attribute.String("http.response.status_class", strconv.Itoa(status/100)+"xx"))...))
		}
	})
}

// statusWriter notes the status code its handler answered.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
