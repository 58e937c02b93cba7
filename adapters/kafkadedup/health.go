package kafkadedup

import "time"

// Stats is what a [Consumer] knows of its recent attempts to settle
// records: a record settles when the wrapper records its outcome in the
// store (and, for a dead letter, sends it to the sink).
type Stats struct {
	// LastSuccess is when a batch of records last settled.
	LastSuccess time.Time
	// LastFailure is when settling a record last failed, and LastError why.
	LastFailure time.Time
	LastError   error
	// FailingSince is when the current run of failures began; zero when
	// the latest attempt succeeded.
	FailingSince time.Time
}

// Stats returns what c knows of its recent attempts to settle records,
// across its runs.
func (c *Consumer) Stats() Stats {
	s := c.health.Snapshot()
	return Stats{LastSuccess: s.LastSuccess, LastFailure: s.LastFailure, LastError: s.LastError, FailingSince: s.FailingSince}
}

// Health returns nil, or an error matching [ErrOutage] (and wrapping the
// last failure) while settling records has kept failing for
// [WithOutageThreshold] or longer: a readiness probe can serve it. A Consumer
// that has handled nothing yet is healthy.
func (c *Consumer) Health() error { return c.health.Health() }
