package otelkit_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/dedupkit/dedup/internal/otelkit"
)

// header is the tests' header type; fields reads and makes it.
type header struct {
	Key   string
	Value []byte
}

type fields struct{}

func (fields) Key(h header) string                  { return h.Key }
func (fields) Value(h header) []byte                { return h.Value }
func (fields) Make(key string, value []byte) header { return header{Key: key, Value: value} }

// spanContext returns a context whose span is remote, sampled and has a
// tracestate, and that span's context.
func spanContext(t *testing.T, traceID, spanID byte) (context.Context, trace.SpanContext) {
	t.Helper()
	state, err := trace.ParseTraceState("vendor=" + string('a'+rune(spanID)))
	require.NoError(t, err)
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{15: traceID}, SpanID: trace.SpanID{7: spanID},
		TraceFlags: trace.FlagsSampled, TraceState: state, Remote: true})
	return trace.ContextWithSpanContext(context.Background(), sc), sc
}

// values returns the headers as a map, failing on a key twice.
func values(t *testing.T, headers []header) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, h := range headers {
		require.NotContains(t, m, h.Key)
		m[h.Key] = string(h.Value)
	}
	return m
}

// tracerProvider and meterProvider record the names they were asked for.
type tracerProvider struct {
	noop.TracerProvider
	names *[]string
}

func (p tracerProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	*p.names = append(*p.names, "tracer "+name)
	return p.TracerProvider.Tracer(name, opts...)
}

type meterProvider struct {
	metricnoop.MeterProvider
	names *[]string
}

func (p meterProvider) Meter(name string, opts ...metric.MeterOption) metric.Meter {
	*p.names = append(*p.names, "meter "+name)
	return p.MeterProvider.Meter(name, opts...)
}

func TestTracerMeter(t *testing.T) {
	tracer, meter, ok := otelkit.TracerMeter(nil, nil, "x")
	require.False(t, ok, "neither provider set: nothing to record")
	require.Nil(t, tracer)
	require.Nil(t, meter)

	var names []string
	tp, mp := tracerProvider{names: &names}, meterProvider{names: &names}
	tracer, meter, ok = otelkit.TracerMeter(tp, nil, "a")
	require.True(t, ok)
	require.NotNil(t, tracer)
	require.Nil(t, meter)
	tracer, meter, ok = otelkit.TracerMeter(nil, mp, "b")
	require.True(t, ok)
	require.Nil(t, tracer)
	require.NotNil(t, meter)
	tracer, meter, ok = otelkit.TracerMeter(tp, mp, "c")
	require.True(t, ok)
	require.NotNil(t, tracer)
	require.NotNil(t, meter)
	require.Equal(t, []string{"tracer a", "meter b", "tracer c", "meter c"}, names)
}

// ReplaceTraceContext puts ctx's trace context in place of the one the
// headers held, or removes it when ctx has no span, and leaves the caller's
// headers as they were.
func TestReplaceTraceContext(t *testing.T) {
	old, _ := spanContext(t, 1, 1)
	headers := otelkit.AddTraceContext(old, fields{}, []header{{Key: "a", Value: []byte("1")}})
	was := values(t, headers)
	require.Len(t, was, 3)

	ctx, sc := spanContext(t, 2, 2)
	got := otelkit.ReplaceTraceContext(ctx, fields{}, headers)
	require.Equal(t, was, values(t, headers), "the caller's headers are untouched")
	require.Equal(t, map[string]string{"a": "1", "traceparent": "00-00000000000000000000000000000002-0000000000000002-01", "tracestate": "vendor=c"},
		values(t, got))
	require.Equal(t, sc, otelkit.SpanContext(fields{}, got))

	require.Equal(t, map[string]string{"a": "1"}, values(t, otelkit.ReplaceTraceContext(context.Background(), fields{}, headers)),
		"without a span the old trace context goes")
	require.Equal(t, was, values(t, headers))
	require.Empty(t, otelkit.ReplaceTraceContext(context.Background(), fields{}, nil))
}

// AddTraceContext adds ctx's trace context to headers that carry none,
// without writing into the caller's array, and keeps one they carry.
func TestAddTraceContext(t *testing.T) {
	ctx, sc := spanContext(t, 3, 3)
	backing := make([]header, 2)
	backing[0] = header{Key: "a", Value: []byte("1")}
	headers := backing[:1]
	got := otelkit.AddTraceContext(ctx, fields{}, headers)
	require.Equal(t, header{}, backing[1], "spare capacity of the caller's array is not written")
	require.Equal(t, map[string]string{"a": "1", "traceparent": "00-00000000000000000000000000000003-0000000000000003-01", "tracestate": "vendor=d"},
		values(t, got))
	require.Equal(t, sc, otelkit.SpanContext(fields{}, got))

	other, _ := spanContext(t, 4, 4)
	again := otelkit.AddTraceContext(other, fields{}, got)
	require.Equal(t, got, again, "a trace context the headers carry is kept")
	require.Same(t, &got[0], &again[0])
	require.Zero(t, testing.AllocsPerRun(100, func() { _ = otelkit.AddTraceContext(other, fields{}, got) }))

	require.Equal(t, headers, otelkit.AddTraceContext(context.Background(), fields{}, headers), "without a span nothing is added")

	empty := []header{{Key: "traceparent"}}
	require.Equal(t, sc, otelkit.SpanContext(fields{}, otelkit.AddTraceContext(ctx, fields{}, empty)[1:]),
		"an empty traceparent is none")
}

func TestSpanContext(t *testing.T) {
	require.False(t, otelkit.SpanContext(fields{}, nil).IsValid())
	require.False(t, otelkit.SpanContext(fields{}, []header{{Key: "traceparent", Value: []byte("garbage")}}).IsValid())
}

func BenchmarkTraceContext(b *testing.B) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{15: 1}, SpanID: trace.SpanID{7: 1}, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	headers := []header{{Key: "a", Value: []byte("1")}, {Key: "b", Value: []byte("2")}}
	traced := otelkit.AddTraceContext(ctx, fields{}, headers)
	for _, bc := range []struct {
		name string
		f    func()
	}{
		{"add", func() { _ = otelkit.AddTraceContext(ctx, fields{}, headers) }},
		{"add/present", func() { _ = otelkit.AddTraceContext(ctx, fields{}, traced) }},
		{"replace", func() { _ = otelkit.ReplaceTraceContext(ctx, fields{}, traced) }},
		{"extract", func() { _ = otelkit.SpanContext(fields{}, traced) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				bc.f()
			}
		})
	}
}
