package outage_test

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/dedupkit/dedup/internal/outage"
	"github.com/dedupkit/dedup/internal/testenv"
)

var (
	errSentinel = errors.New("test: failing")
	errDown     = errors.New("store down")
)

// clock is a time the test moves.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time          { return c.now }
func (c *clock) advance(d time.Duration) { c.now = c.now.Add(d) }

// A run of failures becomes an outage at the threshold: its start is one
// ERROR, each threshold after that brings one ERROR reminder, not one per
// failure, Health reports it with the last error; a success ends it with one
// INFO and clears Health.
func TestTrackerOutage(t *testing.T) {
	logs := &testenv.Logs{}
	const threshold = time.Minute
	c := &clock{now: time.Unix(1_700_000_000, 0)}
	tr := outage.New(slog.New(logs), threshold, errSentinel)
	tr.Now = c.Now

	if level := tr.Failure(errDown); level != slog.LevelWarn {
		t.Errorf("the first failure: level %v, want WARN", level)
	}
	if err := tr.Health(); err != nil {
		t.Errorf("Health before the threshold: %v", err)
	}
	c.advance(threshold)
	for range 5 {
		if level := tr.Failure(errDown); level != slog.LevelDebug {
			t.Fatalf("a failure in the outage: level %v; want DEBUG (the outage is the ERROR)", level)
		}
	}
	if n := logs.Count(slog.LevelError, "dedup: the store or dead-letter sink has been failing"); n != 1 {
		t.Errorf("%d ERROR records of the outage's start for 5 failures, want 1", n)
	}
	if n := logs.Count(slog.LevelError, "still failing"); n != 0 {
		t.Errorf("%d ERROR reminders within the first threshold of the outage, want 0", n)
	}
	c.advance(threshold)
	for range 5 {
		tr.Failure(errDown)
	}
	if n := logs.Count(slog.LevelError, "dedup: store or dead-letter sink still failing"); n != 1 {
		t.Errorf("%d ERROR reminders for 5 failures a threshold later, want 1", n)
	}
	err := tr.Health()
	if !errors.Is(err, errSentinel) || !errors.Is(err, errDown) {
		t.Errorf("Health in the outage: %v, want the sentinel wrapping the last error", err)
	}
	if s := tr.Snapshot(); !s.FailingSince.Equal(c.now.Add(-2*threshold)) || !errors.Is(s.LastError, errDown) || !s.LastSuccess.IsZero() {
		t.Errorf("Snapshot in the outage: %+v", s)
	}

	tr.Success()
	if n := logs.Count(slog.LevelInfo, "recorded again after an outage"); n != 1 {
		t.Errorf("%d INFO records of the recovery, want 1", n)
	}
	if err := tr.Health(); err != nil {
		t.Errorf("Health after a success: %v", err)
	}
	if s := tr.Snapshot(); !s.LastSuccess.Equal(c.now) || !s.FailingSince.IsZero() {
		t.Errorf("Snapshot after a success: %+v", s)
	}
}

// Failures shorter than the threshold are no outage: no ERROR, no INFO when
// they end.
func TestTrackerShortFailures(t *testing.T) {
	logs := &testenv.Logs{}
	c := &clock{now: time.Unix(1_700_000_000, 0)}
	tr := outage.New(slog.New(logs), time.Minute, errSentinel)
	tr.Now = c.Now
	for range 3 {
		tr.Failure(errDown)
		c.advance(10 * time.Second)
	}
	tr.Success()
	if n := logs.Count(slog.LevelError, "") + logs.Count(slog.LevelInfo, ""); n != 0 {
		t.Errorf("%d ERROR or INFO records for failures shorter than the threshold; logs:\n%s", n, logs)
	}
}

// A transport adapter logs at WARN before the outage and DEBUG during it,
// and stops once failures have lasted longer than its bound, with an error
// wrapping the sentinel and the latest failure.
func TestFailed(t *testing.T) {
	errSentinel, errDown := errors.New("outage"), errors.New("store down")
	failing := func(d time.Duration) outage.Snapshot {
		return outage.Snapshot{FailingSince: time.Now().Add(-d), LastError: errDown}
	}
	for _, tc := range []struct {
		name      string
		health    error
		s         outage.Snapshot
		maxOutage time.Duration
		level     slog.Level
		stops     bool
	}{
		{name: "healthy", level: slog.LevelWarn},
		{name: "failing, no outage yet", s: failing(time.Second), maxOutage: time.Minute, level: slog.LevelWarn},
		{name: "outage within the bound", health: errSentinel, s: failing(time.Second), maxOutage: time.Minute, level: slog.LevelDebug},
		{name: "outage past the bound", health: errSentinel, s: failing(2 * time.Minute), maxOutage: time.Minute, level: slog.LevelDebug, stops: true},
		{name: "past the bound before the outage threshold", s: failing(2 * time.Minute), maxOutage: time.Minute, level: slog.LevelWarn, stops: true},
		{name: "no bound", health: errSentinel, s: failing(time.Hour), level: slog.LevelDebug},
	} {
		t.Run(tc.name, func(t *testing.T) {
			level, stop := outage.Failed(tc.health, tc.s, tc.maxOutage, errSentinel)
			if level != tc.level {
				t.Errorf("level %v, want %v", level, tc.level)
			}
			if tc.stops != (stop != nil) {
				t.Fatalf("stop %v, want a stop: %v", stop, tc.stops)
			}
			if stop != nil && (!errors.Is(stop, errSentinel) || !errors.Is(stop, errDown)) {
				t.Errorf("stop %v wraps neither the sentinel nor the failure", stop)
			}
		})
	}
}

// An outage's JSON log lines give durations as Go duration strings
// ("35.297s"), which a person reads, not integer nanoseconds.
func TestTrackerLogsDurationsAsStrings(t *testing.T) {
	logs := testenv.NewJSONLogs(t)
	c := &clock{now: time.Unix(1_700_000_000, 0)}
	tr := outage.New(logs.Logger(slog.LevelInfo), 30*time.Second, errSentinel)
	tr.Now = c.Now

	tr.Failure(errDown)
	c.advance(35297 * time.Millisecond)
	tr.Failure(errDown)
	c.advance(30 * time.Second)
	tr.Failure(errDown)
	c.advance(1500 * time.Millisecond)
	tr.Success()

	for _, want := range []struct{ msg, key, value string }{
		{"dedup: the store or dead-letter sink has been failing; deliveries are not acknowledged and come back", "for", "35.297s"},
		{"dedup: store or dead-letter sink still failing: deliveries are not being acknowledged", "failing_for", "1m5.297s"},
		{"dedup: deliveries are recorded again after an outage", "outage", "1m6.797s"},
	} {
		lines := logs.Lines(want.msg)
		if len(lines) != 1 {
			t.Fatalf("%d lines %q, want 1:\n%s", len(lines), want.msg, logs)
		}
		if got := lines[0][want.key]; got != want.value {
			t.Errorf("%q: %s = %#v, want %q", want.msg, want.key, got, want.value)
		}
	}
}
