package outbox

import (
	"context"

	"github.com/dedupkit/dedup/internal/otelkit"
)

// withTraceContext returns headers with ctx's W3C trace context added,
// unless they carry one already.
func withTraceContext(ctx context.Context, headers []Header) []Header {
	return otelkit.AddTraceContext(ctx, headerFields{}, headers)
}

// headerFields reads and makes an event's headers for otelkit.
type headerFields struct{}

func (headerFields) Key(h Header) string                  { return h.Key }
func (headerFields) Value(h Header) []byte                { return h.Value }
func (headerFields) Make(key string, value []byte) Header { return Header{Key: key, Value: value} }
