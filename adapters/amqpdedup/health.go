package amqpdedup

import (
	"fmt"
	"time"

	"github.com/dedupkit/dedup"
)

// ErrOutage is dedup.ErrOutage: handling deliveries has kept failing (the
// store or the dead-letter sink unreachable) for longer than the wrapper's
// dedup.WithOutageThreshold, as reported by [Consumer.Health], or than
// [WithMaxOutage], as returned by [Consumer.Run].
var ErrOutage = dedup.ErrOutage

// Stats is what the wrapper a [Consumer] runs through knows of its recent
// attempts to settle deliveries.
type Stats = dedup.Stats

// Stats returns what c's wrapper knows of its recent attempts to settle
// deliveries.
func (c *Consumer) Stats() Stats { return c.w.Stats() }

// Health returns nil, or an error matching [ErrOutage] while settling
// deliveries has kept failing for the wrapper's dedup.WithOutageThreshold or
// longer, or an error wrapping the latest failure while Run cannot consume
// the queue (the broker unreachable, the queue missing, access refused), or
// an error matching dedup.ErrConfig once the wrapper has read a delivery
// with the [Messages] of another queue (see [NewConsumer]) or while Run
// finds the dead-letter queue missing (see [WithDeadLetterQueue]): a
// readiness probe can serve it.
func (c *Consumer) Health() error {
	if err := c.mismatch.Err(); err != nil {
		return err
	}
	if err := c.w.Health(); err != nil {
		return err
	}
	if f := c.notConsuming.Load(); f != nil {
		return fmt.Errorf("amqpdedup: not consuming queue %q since %s: %w", c.queue, f.since.UTC().Format(time.RFC3339), f.err)
	}
	if err := c.dlqMissing.Err(); err != nil {
		return err
	}
	return nil
}
