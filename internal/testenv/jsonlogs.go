package testenv

import (
	"bufio"
	"bytes"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"
)

// JSONLogs keeps what a slog JSON handler writes, for tests of the fields a
// person reads in a log line: NewJSONLogs, then Logger, then Lines.
type JSONLogs struct {
	mu  sync.Mutex
	buf bytes.Buffer
	t   testing.TB
}

// NewJSONLogs returns an empty JSONLogs reporting undecodable lines to t.
func NewJSONLogs(t testing.TB) *JSONLogs { return &JSONLogs{t: t} }

// Write keeps p, one record as slog's JSON handler writes it.
func (l *JSONLogs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// Logger returns a logger writing JSON lines to l at level and above.
func (l *JSONLogs) Logger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: level}))
}

// Lines returns the records logged with message msg, each decoded.
func (l *JSONLogs) Lines(msg string) []map[string]any {
	l.t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(l.buf.Bytes()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			l.t.Fatalf("a log line is not JSON: %v: %s", err, sc.Bytes())
		}
		if rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// String returns every line kept.
func (l *JSONLogs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
