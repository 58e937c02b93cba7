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

// A run of failures becomes an outage at the threshold: one ERROR, not one
// per failure, Health reporting it with the last error; a success ends it
// with one INFO and clears Health.
func TestTrackerOutage(t *testing.T) {
	logs := &testenv.Logs{}
	const threshold = 50 * time.Millisecond
	tr := outage.New(slog.New(logs), "test:", threshold, errSentinel)

	if _, out := tr.Failure(errDown); out {
		t.Error("the first failure is an outage")
	}
	if err := tr.Health(); err != nil {
		t.Errorf("Health before the threshold: %v", err)
	}
	time.Sleep(threshold)
	for range 5 {
		if _, out := tr.Failure(errDown); !out {
			t.Fatal("failures past the threshold are not an outage")
		}
	}
	if n := logs.Count(slog.LevelError, "test: store or dead-letter sink failing"); n != 1 {
		t.Errorf("%d ERROR records for 5 failures within one threshold, want 1", n)
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
	if n := logs.Count(slog.LevelInfo, "outage over"); n != 1 {
		t.Errorf("%d INFO records of the outage's end, want 1", n)
	}
	tr.Success()
	if n := logs.Count(slog.LevelInfo, "outage over"); n != 1 {
		t.Errorf("a success outside an outage logged its end again")
	}
}
