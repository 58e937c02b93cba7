package sqsdedup

import (
	"errors"
	"time"
)

// ErrOutage means handling messages has kept failing (the store or the
// dead-letter sink unreachable) for longer than [WithOutageThreshold], as
// reported by [Consumer.Health], or than [WithMaxOutage], as returned by
// [Consumer.Run].
var ErrOutage = errors.New("sqsdedup: store or dead-letter sink failing")

// Stats is what a [Consumer] knows of its recent attempts to settle
// messages: a message settles when the wrapper records its outcome in the
// store (and, for a dead letter, sends it to the sink).
type Stats struct {
	// LastSuccess is when a message last settled.
	LastSuccess time.Time
	// LastFailure is when settling a message last failed, and LastError why.
	LastFailure time.Time
	LastError   error
	// FailingSince is when the current run of failures began; zero when
	// the latest attempt succeeded.
	FailingSince time.Time
}

// Stats returns what c knows of its recent attempts to settle messages,
// across its runs.
func (c *Consumer) Stats() Stats {
	s := c.health.Snapshot()
	return Stats{LastSuccess: s.LastSuccess, LastFailure: s.LastFailure, LastError: s.LastError, FailingSince: s.FailingSince}
}

// Health returns nil, or an error matching [ErrOutage] (and wrapping the
// last failure) while settling messages has kept failing for
// [WithOutageThreshold] or longer: a readiness probe can serve it. A Consumer
// that has handled nothing yet is healthy.
func (c *Consumer) Health() error { return c.health.Health() }
