package testenv

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
)

// Logs is a slog.Handler keeping every record at every level, for tests of
// what is logged and at which level: slog.New(&Logs{}).
type Logs struct {
	mu      sync.Mutex
	records []slog.Record
}

// Enabled reports true: every level is kept.
func (l *Logs) Enabled(context.Context, slog.Level) bool { return true }

// Handle keeps r.
func (l *Logs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r.Clone())
	return nil
}

// WithAttrs returns l: attributes are not kept.
func (l *Logs) WithAttrs([]slog.Attr) slog.Handler { return l }

// WithGroup returns l: groups are not kept.
func (l *Logs) WithGroup(string) slog.Handler { return l }

// Count returns how many records at level have a message containing text.
func (l *Logs) Count(level slog.Level, text string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.records {
		if r.Level == level && strings.Contains(r.Message, text) {
			n++
		}
	}
	return n
}

// Attrs returns the attributes, by key as their values print, of each
// record at level whose message is msg.
func (l *Logs) Attrs(level slog.Level, msg string) []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]string
	for _, r := range l.records {
		if r.Level != level || r.Message != msg {
			continue
		}
		attrs := map[string]string{}
		r.Attrs(func(a slog.Attr) bool {
			attrs[a.Key] = a.Value.String()
			return true
		})
		out = append(out, attrs)
	}
	return out
}

// String returns the records' levels and messages, one a line.
func (l *Logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, r := range l.records {
		fmt.Fprintf(&b, "%s %s\n", r.Level, r.Message)
	}
	return b.String()
}
