package main

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/dedupkit/dedup/internal/testenv"
)

// TestExample runs the example against the test database: every committed
// order shipped once, republished events skipped.
func TestExample(t *testing.T) {
	pool, dsn := testenv.PostgresInSchema(t)
	if err := run(context.Background(), dsn, 40, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	if got := shipments(context.Background(), pool); got != 30 {
		t.Fatalf("%d shipments, want one per committed order (30)", got)
	}
}
