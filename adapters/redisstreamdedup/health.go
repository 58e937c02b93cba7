package redisstreamdedup

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/outage"
)

// ErrOutage is dedup.ErrOutage: settling entries has kept failing (the
// store or the dead-letter sink unreachable) for longer than the wrapper's
// dedup.WithOutageThreshold, as reported by [Consumer.Health], or than
// [WithMaxOutage], as returned by [Consumer.Run]; Health also reports with
// it Redis not answering Run's reads.
var ErrOutage = dedup.ErrOutage

// Stats is what the wrapper a [Consumer] runs through knows of its recent
// attempts to settle entries.
type Stats = dedup.Stats

// Stats returns what c's wrapper knows of its recent attempts to settle
// entries.
func (c *Consumer) Stats() Stats { return c.w.Stats() }

// Health returns nil, or an error matching [ErrOutage] (and wrapping the
// last failure) while settling entries has kept failing for the wrapper's
// dedup.WithOutageThreshold or longer, or, from a failed read until one
// succeeds, while Redis does not answer Run's reads: a readiness probe can
// serve it.
func (c *Consumer) Health() error {
	if err := c.w.Health(); err != nil {
		return err
	}
	if l := c.lost.Load(); l != nil {
		return &outage.Error{Msg: fmt.Sprintf("redisstreamdedup: Redis not answering reads of stream %s for %s (since %s): %v",
			c.stream, lostFor(l), l.since.UTC().Format(time.RFC3339), l.err), Err: l.err}
	}
	return nil
}

// loss is since when, and why, Redis has not answered Run's reads.
type loss struct {
	since time.Time
	err   error
}

// failed records and logs a read that failed, to be tried again after wait.
func (c *Consumer) failed(err error, wait time.Duration) {
	l := c.lost.Load()
	if l == nil {
		l = &loss{since: time.Now()}
	}
	c.lost.Store(&loss{since: l.since, err: err})
	c.log.Warn("redisstreamdedup: read failed", slog.Any("error", err), slog.String("retry_in", wait.String()))
}

// answered records a read that succeeded, logging the end of a loss.
func (c *Consumer) answered() {
	if l := c.lost.Swap(nil); l != nil {
		c.log.Info("redisstreamdedup: Redis answers reads again", slog.String("lost_for", lostFor(l)))
	}
}

func lostFor(l *loss) string { return time.Since(l.since).Round(time.Millisecond).String() }
