package outbox

import (
	"context"
	"slices"

	"go.opentelemetry.io/otel/propagation"
)

// withTraceContext returns headers with ctx's W3C trace context added,
// unless they carry one already.
func withTraceContext(ctx context.Context, headers []Header) []Header {
	c := headerCarrier{headers: headers}
	if c.Get("traceparent") != "" {
		return headers
	}
	c.headers = slices.Clip(headers) // appending never writes into the caller's array
	propagation.TraceContext{}.Inject(ctx, &c)
	return c.headers
}

// headerCarrier writes a trace context into an event's headers.
type headerCarrier struct{ headers []Header }

func (c *headerCarrier) Get(key string) string {
	for _, h := range c.headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func (c *headerCarrier) Set(key, value string) {
	c.headers = append(c.headers, Header{Key: key, Value: []byte(value)})
}

func (c *headerCarrier) Keys() []string {
	keys := make([]string, len(c.headers))
	for i, h := range c.headers {
		keys[i] = h.Key
	}
	return keys
}
