// Package outage tracks, for a transport adapter's consumer, whether
// settling messages (the store or the dead-letter sink) keeps failing: for
// its health report, its reminders in the log, and its bound on an outage.
// The wrapper (dedup.WithOutageThreshold) logs an outage's start and end.
package outage

import (
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Tracker records the outcome of each attempt to settle a message. A run of
// failures lasting at least its threshold is an outage: the wrapper logs its
// start at ERROR, the Tracker logs a reminder at ERROR each threshold after
// that while it lasts (never per message), and Health reports it. It is safe
// for concurrent use.
type Tracker struct {
	log       *slog.Logger
	prefix    string // of log messages
	threshold time.Duration
	maxOutage time.Duration // an outage longer than this stops the consumer; 0: never
	sentinel  error         // wrapped by Health's errors

	mu          sync.Mutex
	lastSuccess time.Time
	lastFailure time.Time
	since       time.Time // start of the current run of failures; zero after a success
	lastErr     error
	failures    int       // since the last ERROR
	loggedAt    time.Time // of the last ERROR of the current outage (the first is the wrapper's)
}

// New returns a Tracker logging to log, with messages starting with prefix
// (the package's name and a colon), for which failing for threshold is an
// outage, and failing for longer than maxOutage (unless 0) a reason to stop;
// Health's errors wrap sentinel.
func New(log *slog.Logger, prefix string, threshold, maxOutage time.Duration, sentinel error) *Tracker {
	return &Tracker{log: log, prefix: prefix, threshold: threshold, maxOutage: maxOutage, sentinel: sentinel}
}

// Snapshot is what a Tracker knows of the recent attempts.
type Snapshot struct {
	LastSuccess  time.Time
	LastFailure  time.Time
	FailingSince time.Time
	LastError    error
}

// Success records an attempt whose outcome the store recorded.
func (t *Tracker) Success() {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lastSuccess = now
	t.since, t.loggedAt, t.failures = time.Time{}, time.Time{}, 0
}

// Failure records an attempt that failed with err. It returns the level to
// log that failure at: WARN, or DEBUG during an outage, which is logged at
// ERROR here; and, once failures have lasted longer than the maximum, the
// error to stop the consumer with.
func (t *Tracker) Failure(err error) (level slog.Level, stop error) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.since.IsZero() {
		t.since = now
	}
	t.lastFailure, t.lastErr = now, err
	t.failures++
	failingFor := now.Sub(t.since)
	if t.maxOutage > 0 && failingFor > t.maxOutage {
		stop = fmt.Errorf("%w; stopping after more than %v", t.errLocked(), t.maxOutage)
	}
	if failingFor < t.threshold {
		return slog.LevelWarn, stop
	}
	if t.loggedAt.IsZero() {
		t.loggedAt = t.since.Add(t.threshold) // when the wrapper logged the start
	}
	if now.Sub(t.loggedAt) >= t.threshold {
		t.log.Error(t.prefix+" store or dead-letter sink still failing: messages are not being settled",
			slog.Duration("failing_for", failingFor.Round(time.Millisecond)), slog.Time("since", t.since),
			slog.Int("failures", t.failures), slog.Any("error", err))
		t.loggedAt, t.failures = now, 0
	}
	return slog.LevelDebug, stop
}

// Snapshot returns what t knows.
func (t *Tracker) Snapshot() Snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	return Snapshot{LastSuccess: t.lastSuccess, LastFailure: t.lastFailure, FailingSince: t.since, LastError: t.lastErr}
}

// Health returns nil, or, once the attempts since the last success have
// been failing for the threshold or longer, an error wrapping the sentinel
// and the last failure.
func (t *Tracker) Health() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.since.IsZero() || time.Since(t.since) < t.threshold {
		return nil
	}
	return t.errLocked()
}

// Err returns an error wrapping the sentinel and the last failure, saying
// how long attempts have been failing; nil after a success.
func (t *Tracker) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.since.IsZero() {
		return nil
	}
	return t.errLocked()
}

func (t *Tracker) errLocked() error {
	return fmt.Errorf("%w for %v (since %s): %w", t.sentinel, time.Since(t.since).Round(time.Millisecond),
		t.since.UTC().Format(time.RFC3339), t.lastErr)
}
