package adapterkit

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/outage"
	"github.com/dedupkit/dedup/internal/testenv"
)

var errStore = errors.New("store down")

// policy returns a Policy with a backoff of failures seconds (or none) and
// an Outage that is never in an outage; gaveUp collects what it gives up
// with.
func policy(backoff bool, health error, maxOutage time.Duration, since time.Time, gaveUp *[]error) *Policy {
	p := &Policy{InFlightDelay: 5 * time.Second,
		Outage: NewOutage(func() error { return health },
			func() outage.Snapshot { return outage.Snapshot{FailingSince: since, LastError: errStore} },
			maxOutage, func(err error) { *gaveUp = append(*gaveUp, err) })}
	if backoff {
		p.Backoff = func(n int) time.Duration { return time.Duration(n) * time.Second }
	}
	return p
}

// Every outcome maps to its one action, with its delay.
func TestDecideMapsEachOutcome(t *testing.T) {
	var gave []error
	p := policy(true, nil, 0, time.Time{}, &gave)
	b := p.Batch(nil)
	for _, c := range []struct {
		res  deduptype.Result
		want Decision
	}{
		{deduptype.Result{Outcome: deduptype.OutcomeProcessed}, Decision{Action: Ack}},
		{deduptype.Result{Outcome: deduptype.OutcomeDuplicate}, Decision{Action: Ack}},
		{deduptype.Result{Outcome: deduptype.OutcomeDeadLettered}, Decision{Action: Park}},
		{deduptype.Result{Outcome: deduptype.OutcomeConflict}, Decision{Action: Park}},
		{deduptype.Result{Outcome: deduptype.OutcomeRetry, RetryAfter: time.Minute}, Decision{Action: Redeliver, Delay: time.Minute}},
		{deduptype.Result{Outcome: deduptype.OutcomeRetry, RetryAfter: -time.Second}, Decision{Action: Redeliver}},
		// The in-flight delay bounds the wrapper's RetryAfter.
		{deduptype.Result{Outcome: deduptype.OutcomeInFlight, RetryAfter: time.Minute}, Decision{Action: Redeliver, Delay: 5 * time.Second}},
		{deduptype.Result{Outcome: deduptype.OutcomeInFlight, RetryAfter: time.Second}, Decision{Action: Redeliver, Delay: time.Second}},
	} {
		if got := b.Decide(c.res, nil); got != c.want {
			t.Errorf("Decide(%v): %+v, want %+v", c.res.Outcome, got, c.want)
		}
	}
	// A result with no outcome is never acknowledged.
	if d := b.Decide(deduptype.Result{}, nil); d.Settled() || !errors.Is(d.Err, errUnknownOutcome) {
		t.Errorf("Decide(no outcome): %+v, want a failure", d)
	}
}

// A batch's failures count once; only a settled outcome ends the run of
// failures, not OutcomeRetry nor OutcomeInFlight.
func TestFailuresInARowEndOnlyWhenSettled(t *testing.T) {
	var gave []error
	p := policy(true, nil, 0, time.Time{}, &gave)
	b := p.Batch(nil)
	for range 3 {
		if d := b.Decide(deduptype.Result{}, errStore); d.Action != Redeliver || d.Delay != time.Second || d.Failures != 1 || d.Level != slog.LevelWarn {
			t.Fatalf("first batch's failure: %+v, want Redeliver after 1 s, 1 failure, WARN", d)
		}
	}
	b = p.Batch(nil)
	b.Decide(deduptype.Result{Outcome: deduptype.OutcomeRetry}, nil)
	b.Decide(deduptype.Result{Outcome: deduptype.OutcomeInFlight}, nil)
	if d := p.Batch(nil).Decide(deduptype.Result{}, errStore); d.Failures != 2 || d.Delay != 2*time.Second {
		t.Errorf("failure after a retry and an in-flight: %+v, want the 2nd in a row", d)
	}
	p.Batch(nil).Decide(deduptype.Result{Outcome: deduptype.OutcomeDeadLettered}, nil)
	if d := p.Batch(nil).Decide(deduptype.Result{}, errStore); d.Failures != 1 || d.Delay != time.Second {
		t.Errorf("failure after a settled delivery: %+v, want the 1st in a row", d)
	}
	if len(gave) != 0 {
		t.Errorf("gave up with %v, want no bound", gave)
	}
}

// While Run is stopping, a failure is given back at once at WARN, neither
// counted nor checked against the outage bound.
func TestFailureWhileStopping(t *testing.T) {
	var gave []error
	p := policy(true, errors.New("outage"), time.Millisecond, time.Now().Add(-time.Hour), &gave)
	stop := make(chan struct{})
	close(stop)
	d := p.Batch(stop).Decide(deduptype.Result{}, errStore)
	if want := (Decision{Action: Redeliver, Err: errStore, Level: slog.LevelWarn}); d != want {
		t.Errorf("failure while stopping: %+v, want %+v", d, want)
	}
	if len(gave) != 0 || p.failures.Load() != 0 {
		t.Errorf("counted (%d) or gave up (%v) while stopping", p.failures.Load(), gave)
	}
}

// During an outage a failure is logged at DEBUG (the wrapper logs the
// outage) and, past the bound, gives up once per batch; without a backoff
// it is left to the broker's timeout.
func TestFailureDuringAnOutage(t *testing.T) {
	var gave []error
	p := policy(false, errors.New("outage"), time.Minute, time.Now().Add(-time.Hour), &gave)
	b := p.Batch(nil)
	for range 2 {
		if d := b.Decide(deduptype.Result{}, errStore); d.Action != Lapse || d.Level != slog.LevelDebug {
			t.Errorf("failure during an outage: %+v, want Lapse at DEBUG", d)
		}
	}
	if len(gave) != 1 || !errors.Is(gave[0], deduptype.ErrOutage) {
		t.Errorf("gave up with %v, want once with ErrOutage", gave)
	}
}

// A Policy with no Outage (a Lambda handler, under no Run) decides a
// failure at WARN, counted, and never gives up; without a backoff it lapses.
func TestFailureWithNoOutage(t *testing.T) {
	p := &Policy{InFlightDelay: Unbounded}
	for n := 1; n <= 2; n++ {
		d := p.Batch(nil).Decide(deduptype.Result{}, errStore)
		if want := (Decision{Action: Lapse, Err: errStore, Level: slog.LevelWarn, Failures: n}); d != want {
			t.Errorf("failure %d: %+v, want %+v", n, d, want)
		}
	}
	// Unbounded leaves the wrapper's RetryAfter as it is.
	if d := p.Batch(nil).Decide(deduptype.Result{Outcome: deduptype.OutcomeInFlight, RetryAfter: time.Hour}, nil); d.Action != Redeliver || d.Delay != time.Hour {
		t.Errorf("in flight: %+v, want Redeliver after the wrapper's hour", d)
	}
}

// A delivery not settled is logged with the wait before it comes back as a
// Go duration string, and its error.
func TestLogFailureRetryIn(t *testing.T) {
	logs := testenv.NewJSONLogs(t)
	d := Decision{Action: Redeliver, Delay: 1500 * time.Millisecond, Err: errStore, Level: slog.LevelWarn}
	d.LogFailure(context.Background(), logs.Logger(slog.LevelInfo), "test: not acknowledged", slog.String("message_id", "m1"))
	lines := logs.Lines("test: not acknowledged")
	if len(lines) != 1 {
		t.Fatalf("%d lines, want 1:\n%s", len(lines), logs)
	}
	for key, want := range map[string]string{"level": "WARN", "retry_in": "1.5s", "error": "store down", "message_id": "m1"} {
		if got := lines[0][key]; got != want {
			t.Errorf("%s = %#v, want %q", key, got, want)
		}
	}
}

// FailureBackoff starts at about a second and is bounded by
// MaxFailureDelay.
func TestFailureBackoffBounds(t *testing.T) {
	for range 50 {
		if d := FailureBackoff(1); d < time.Second/2 || d >= time.Second {
			t.Fatalf("first failure: %v, want in [0.5s, 1s)", d)
		}
		if d := FailureBackoff(1000); d < MaxFailureDelay/2 || d >= MaxFailureDelay {
			t.Fatalf("1000th failure: %v, want in [%v, %v)", d, MaxFailureDelay/2, MaxFailureDelay)
		}
	}
}
