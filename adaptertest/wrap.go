package adaptertest

import (
	"context"
	"testing"

	"github.com/dedupkit/dedup"
)

// Wrap returns the wrapper a harness's consumer runs: cfg's handler over
// msgs, each message read as a [Message] by read, with sink as its
// dead-letter sink followed by cfg's options. It fails t on an invalid
// configuration.
func Wrap[M any](t testing.TB, cfg Config, msgs dedup.Messages[M], sink dedup.Sink, read func(M) Message) *dedup.Wrapper[M] {
	t.Helper()
	h := func(ctx context.Context, m M) error { return cfg.Handler(ctx, read(m)) }
	opts := append([]dedup.Opt{dedup.WithSink(sink)}, cfg.Options...)
	w, err := dedup.Wrap(cfg.Store, msgs, h, opts...)
	if err != nil {
		t.Fatalf("adaptertest: wrap: %v", err)
	}
	return w
}
