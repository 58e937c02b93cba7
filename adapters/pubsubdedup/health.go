package pubsubdedup

import "github.com/dedupkit/dedup"

// ErrOutage is dedup.ErrOutage: settling messages has kept failing (the
// store or the dead-letter sink unreachable) for longer than the wrapper's
// dedup.WithOutageThreshold, as reported by [Consumer.Health], or than
// [WithMaxOutage], as returned by [Consumer.Run].
var ErrOutage = dedup.ErrOutage

// Stats is what the wrapper a [Consumer] runs through knows of its recent
// attempts to settle messages.
type Stats = dedup.Stats

// Stats returns what c's wrapper knows of its recent attempts to settle
// messages.
func (c *Consumer) Stats() Stats { return c.w.Stats() }

// Health returns nil, or an error matching [ErrOutage] (and wrapping the
// last failure) while settling messages has kept failing for the wrapper's
// dedup.WithOutageThreshold or longer: a readiness probe can serve it. The
// client retries a lost connection to Pub/Sub by itself and does not say
// so; Health does not cover it.
func (c *Consumer) Health() error { return c.w.Health() }
