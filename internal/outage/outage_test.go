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

// A run of failures becomes an outage at the threshold (the wrapper logs its
// start): Health reports it with the last error, each threshold after that
// brings one ERROR reminder, not one per failure; a success clears Health.
func TestTrackerOutage(t *testing.T) {
	logs := &testenv.Logs{}
	const threshold = 50 * time.Millisecond
	tr := outage.New(slog.New(logs), "test:", threshold, 0, errSentinel)

	if level, stop := tr.Failure(errDown); level != slog.LevelWarn || stop != nil {
		t.Errorf("the first failure: level %v, stop %v; want WARN and no stop", level, stop)
	}
	if err := tr.Health(); err != nil {
		t.Errorf("Health before the threshold: %v", err)
	}
	time.Sleep(threshold)
	for range 5 {
		if level, stop := tr.Failure(errDown); level != slog.LevelDebug || stop != nil {
			t.Fatalf("a failure in the outage: level %v, stop %v; want DEBUG (the outage is the ERROR) and no stop", level, stop)
		}
	}
	if n := logs.Count(slog.LevelError, "still failing"); n != 0 {
		t.Errorf("%d ERROR reminders within the first threshold of the outage, want 0 (the wrapper logs its start)", n)
	}
	time.Sleep(threshold)
	for range 5 {
		tr.Failure(errDown)
	}
	if n := logs.Count(slog.LevelError, "test: store or dead-letter sink still failing"); n != 1 {
		t.Errorf("%d ERROR reminders for 5 failures a threshold later, want 1", n)
	}
	err := tr.Health()
	if !errors.Is(err, errSentinel) || !errors.Is(err, errDown) {
		t.Errorf("Health in the outage: %v, want the sentinel wrapping the last error", err)
	}
	if s := tr.Snapshot(); s.FailingSince.IsZero() || !errors.Is(s.LastError, errDown) || !s.LastSuccess.IsZero() {
		t.Errorf("Snapshot in the outage: %+v", s)
	}

	tr.Success()
	if err := tr.Health(); err != nil {
		t.Errorf("Health after a success: %v", err)
	}
	if err := tr.Err(); err != nil {
		t.Errorf("Err after a success: %v", err)
	}
}

// Failures lasting longer than the maximum give the error to stop with.
func TestTrackerMax(t *testing.T) {
	const maxOutage = 50 * time.Millisecond
	tr := outage.New(slog.New(slog.DiscardHandler), "test:", time.Hour, maxOutage, errSentinel)
	if _, stop := tr.Failure(errDown); stop != nil {
		t.Errorf("the first failure stops: %v", stop)
	}
	time.Sleep(2 * maxOutage)
	if _, stop := tr.Failure(errDown); !errors.Is(stop, errSentinel) || !errors.Is(stop, errDown) {
		t.Errorf("a failure past the maximum: stop %v, want the sentinel wrapping the last error", stop)
	}
}
