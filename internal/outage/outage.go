// Package outage tracks whether a wrapper's deliveries keep failing to be
// made durable (the store or the dead-letter sink failing): for its health
// report, the transport adapters' reports and their bound on an outage, and
// the log. It is the one tracker: the wrapper feeds it, the adapters read it.
package outage

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/logattr"
)

// Tracker records the outcome of each attempt to make a delivery durable. A
// run of failures lasting at least its threshold is an outage: it logs the
// outage's start at ERROR, a reminder at ERROR each threshold after that
// while it lasts (never one per failure), and its end at INFO, and Health
// reports it. It is safe for concurrent use.
type Tracker struct {
	log       *slog.Logger
	threshold time.Duration
	sentinel  error // wrapped by Health's errors

	// Now is the clock; tests drive it.
	Now func() time.Time

	failing     atomic.Bool  // a run of failures is under way: Success's slow path
	lastSuccess atomic.Int64 // unix nanoseconds; 0: none yet

	mu          sync.Mutex // guards the fields below
	lastFailure time.Time
	since       time.Time // start of the current run of failures; zero after a success
	lastErr     error
	failures    int       // since the last ERROR
	loggedAt    time.Time // of the last ERROR of the current outage; zero: not reported
}

// New returns a Tracker logging to log, for which failing for threshold is
// an outage; Health's errors wrap sentinel.
func New(log *slog.Logger, threshold time.Duration, sentinel error) *Tracker {
	return &Tracker{log: log, threshold: threshold, sentinel: sentinel, Now: time.Now}
}

// Snapshot is what a Tracker knows of the recent attempts.
// It has the fields of dedup.Stats, in their order, so that each converts
// to the other.
type Snapshot struct {
	LastSuccess  time.Time
	LastFailure  time.Time
	LastError    error
	FailingSince time.Time
}

// Success records an attempt whose outcome was made durable. It reads no
// clock unless it ends a run of failures (a clock read costs as much as the
// rest of a duplicate's path): the wrapper stamps the time with Stamp once
// per call, however many deliveries the call settled.
func (t *Tracker) Success() {
	if !t.failing.Load() {
		return // the hot path: healthy and staying so
	}
	now := t.Now()
	t.lastSuccess.Store(now.UnixNano())
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.loggedAt.IsZero() {
		t.log.Info("dedup: deliveries are recorded again after an outage",
			logattr.Duration("outage", now.Sub(t.since).Round(time.Millisecond)))
	}
	t.since, t.loggedAt, t.failures, t.lastErr = time.Time{}, time.Time{}, 0, nil
	t.failing.Store(false)
}

// Stamp records now as the time of the latest success.
func (t *Tracker) Stamp() { t.lastSuccess.Store(t.Now().UnixNano()) }

// Failure records an attempt that failed with err. It returns the level to
// log that failure at where it happened: WARN, or DEBUG during an outage,
// which the Tracker logs at ERROR.
func (t *Tracker) Failure(err error) slog.Level {
	now := t.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.since.IsZero() {
		t.since = now
		t.failing.Store(true)
	}
	t.lastFailure, t.lastErr = now, err
	t.failures++
	failingFor := now.Sub(t.since)
	switch {
	case failingFor < t.threshold:
		return slog.LevelWarn
	case t.loggedAt.IsZero():
		t.log.Error("dedup: the store or dead-letter sink has been failing; deliveries are not acknowledged and come back",
			logattr.Duration("for", failingFor.Round(time.Millisecond)), slog.Any("error", err))
		t.loggedAt, t.failures = now, 0
	case now.Sub(t.loggedAt) >= t.threshold:
		t.log.Error("dedup: store or dead-letter sink still failing: deliveries are not being acknowledged",
			logattr.Duration("failing_for", failingFor.Round(time.Millisecond)), slog.Time("since", t.since),
			slog.Int("failures", t.failures), slog.Any("error", err))
		t.loggedAt, t.failures = now, 0
	}
	return slog.LevelDebug
}

// Snapshot returns what t knows.
func (t *Tracker) Snapshot() Snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := Snapshot{LastFailure: t.lastFailure, FailingSince: t.since, LastError: t.lastErr}
	if ns := t.lastSuccess.Load(); ns != 0 {
		s.LastSuccess = time.Unix(0, ns)
	}
	return s
}

// Health returns nil, or, once the attempts since the last success have
// been failing for the threshold or longer, an error wrapping the sentinel
// and the last failure.
func (t *Tracker) Health() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.since.IsZero() || t.Now().Sub(t.since) < t.threshold {
		return nil
	}
	return t.errLocked()
}

func (t *Tracker) errLocked() error { return outageError(t.sentinel, t.since, t.Now(), t.lastErr) }

// outageError says that failures have run since since, up to now, wrapping
// sentinel and the latest failure, last.
func outageError(sentinel error, since, now time.Time, last error) error {
	return fmt.Errorf("%w for %v (since %s): %w", sentinel, now.Sub(since).Round(time.Millisecond),
		since.UTC().Format(time.RFC3339), last)
}

// Failed returns the level at which a transport adapter logs a delivery it
// could not settle (WARN, or DEBUG during an outage, which the wrapper logs at
// ERROR) and, once failures have lasted longer than maxOutage (unless 0),
// the error to stop with, wrapping sentinel and the latest failure. health
// and s are the wrapper's Health and Stats.
func Failed(health error, s Snapshot, maxOutage time.Duration, sentinel error) (slog.Level, error) {
	var stop error
	if now := time.Now(); maxOutage > 0 && !s.FailingSince.IsZero() && now.Sub(s.FailingSince) > maxOutage {
		stop = fmt.Errorf("%w; stopping after more than %v", outageError(sentinel, s.FailingSince, now, s.LastError), maxOutage)
	}
	if health != nil {
		return slog.LevelDebug, stop
	}
	return slog.LevelWarn, stop
}

// Error is a part's Health error for an outage it words itself (a relay's
// failing passes, a lost connection): it matches deduptype.ErrOutage and
// Err, the failure behind it if known.
type Error struct {
	Msg string
	Err error
}

func (e *Error) Error() string   { return e.Msg }
func (e *Error) Unwrap() []error { return []error{deduptype.ErrOutage, e.Err} }
