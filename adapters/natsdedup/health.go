package natsdedup

import "github.com/dedupkit/dedup"

// ErrOutage is dedup.ErrOutage: settling messages has kept failing (the
// store or the dead-letter sink unreachable) for longer than the wrapper's
// dedup.WithOutageThreshold, as reported by [Consumer.Health], or than
// [WithMaxOutage], as returned by [Consumer.Run]; Health also reports with
// it a lost connection ([WithJetStream]).
var ErrOutage = dedup.ErrOutage

// Stats is what the wrapper a [Consumer] runs through knows of its recent
// attempts to settle messages.
type Stats = dedup.Stats

// Stats returns what c's wrapper knows of its recent attempts to settle
// messages.
func (c *Consumer) Stats() Stats { return c.w.Stats() }

// Health returns nil, or an error matching [ErrOutage] (and wrapping the
// last failure) while settling messages has kept failing for the wrapper's
// dedup.WithOutageThreshold or longer, or, from the moment it is lost until
// it is back, while Run's connection is lost; or an error matching
// dedup.ErrConfig while Run finds no stream capturing its dead-letter
// subjects (see [WithJetStream]): a readiness probe can serve it.
func (c *Consumer) Health() error {
	if err := c.w.Health(); err != nil {
		return err
	}
	if err := c.connHealth(); err != nil {
		return err
	}
	if err := c.dlqMissing.Err(); err != nil {
		return err
	}
	return nil
}
