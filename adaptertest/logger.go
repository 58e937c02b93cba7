package adaptertest

import (
	"log/slog"
	"strings"
	"testing"
)

// Logger returns a logger of warnings and errors to t's log, for a
// consumer or wrapper under test: its complaints show beside a failure.
// Whatever logs to it must be done by the end of the test.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
