package otelkit

import (
	"context"
	"slices"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// The W3C trace context's headers.
const (
	traceparent = "traceparent"
	tracestate  = "tracestate"
)

// Fields reads and makes the headers of type H, key-value pairs; an
// implementation is an empty struct, whose zero value the carriers use, so
// that a carrier costs no more than its slice.
type Fields[H any] interface {
	// Key returns h's key.
	Key(h H) string
	// Value returns h's value.
	Value(h H) []byte
	// Make returns a header of key and value.
	Make(key string, value []byte) H
}

// ReplaceTraceContext returns headers, in a new array, with the W3C trace
// context of ctx's span in place of any they held.
func ReplaceTraceContext[H any, F Fields[H]](ctx context.Context, f F, headers []H) []H {
	c := carrier[H, F]{headers: slices.DeleteFunc(slices.Clone(headers), func(h H) bool {
		k := f.Key(h)
		return k == traceparent || k == tracestate
	})}
	propagation.TraceContext{}.Inject(ctx, &c)
	return c.headers
}

// AddTraceContext returns headers with the W3C trace context of ctx's span
// added, unless they carry a traceparent already; it never writes into
// headers' array.
func AddTraceContext[H any, F Fields[H]](ctx context.Context, f F, headers []H) []H {
	if len(value(f, headers, traceparent)) > 0 {
		return headers
	}
	c := carrier[H, F]{headers: slices.Clip(headers)} // appending never writes into the caller's array
	propagation.TraceContext{}.Inject(ctx, &c)
	return c.headers
}

// SpanContext returns the span context of the W3C trace context headers
// carry, invalid when they carry none.
func SpanContext[H any, F Fields[H]](f F, headers []H) trace.SpanContext {
	c := carrier[H, F]{headers: headers}
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), &c))
}

// carrier is a propagation.TextMapCarrier over headers.
type carrier[H any, F Fields[H]] struct{ headers []H }

func (c *carrier[H, F]) Get(key string) string {
	var f F
	return string(value(f, c.headers, key))
}

func (c *carrier[H, F]) Set(key, value string) {
	var f F
	c.headers = append(c.headers, f.Make(key, []byte(value)))
}

func (c *carrier[H, F]) Keys() []string {
	var f F
	keys := make([]string, len(c.headers))
	for i, h := range c.headers {
		keys[i] = f.Key(h)
	}
	return keys
}

// value returns the value of the first of headers whose key is key, nil if
// none is.
func value[H any, F Fields[H]](f F, headers []H, key string) []byte {
	for _, h := range headers {
		if f.Key(h) == key {
			return f.Value(h)
		}
	}
	return nil
}
