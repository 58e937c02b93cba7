package kafkadedup

import "github.com/dedupkit/dedup"

// Stats is what the wrapper a [Consumer] runs through knows of its recent
// attempts to settle records: a record settles when the wrapper records its
// outcome in the store (and, for a dead letter, sends it to the sink).
type Stats = dedup.Stats

// Stats returns what c's wrapper knows of its recent attempts to settle
// records.
func (c *Consumer) Stats() Stats { return c.w.Stats() }

// Health returns nil, or an error matching [ErrOutage] (and wrapping the
// last failure) while settling records has kept failing for the wrapper's
// dedup.WithOutageThreshold or longer, or an error matching
// kerr.UnknownTopicOrPartition, naming them, while topics Run consumes do
// not exist: a readiness probe can serve it. A Consumer that has handled
// nothing yet is healthy.
func (c *Consumer) Health() error {
	if err := c.w.Health(); err != nil {
		return err
	}
	return c.missing.get()
}
