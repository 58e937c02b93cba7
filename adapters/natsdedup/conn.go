package natsdedup

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/dedupkit/dedup/internal/outage"
)

// connReminder is how often a connection still lost is logged again.
const connReminder = 30 * time.Second

// connLoss is since when, and why, the connection a Consumer pulls on has
// been lost.
type connLoss struct {
	since time.Time
	err   error // the connection's last error when it was lost, if any
}

// watchConn follows the connection of [WithJetStream] until bg is done:
// it listens to the connection's status changes (a listener of its own,
// so that the handlers the user set stay as they are) and records a lost
// connection for Health, logging the loss at WARN, a reminder at WARN every
// connReminder while it lasts, and the return at INFO.
func (c *Consumer) watchConn(bg context.Context) {
	changes := c.nc.StatusChanged()
	defer c.nc.RemoveStatusListener(changes)
	remind := time.NewTicker(connReminder)
	defer remind.Stop()
	defer c.connLost.Store(nil) // Health speaks of a running consumer only
	c.checkConn()
	for {
		select {
		case <-bg.Done():
			return
		case <-changes:
			c.checkConn()
		case <-remind.C:
			if l := c.connLost.Load(); l != nil {
				c.log.Warn("natsdedup: connection to the NATS server still lost",
					slog.String("status", c.nc.Status().String()), slog.String("for", lostFor(l)))
			}
		}
	}
}

// checkConn compares the connection's status with what c recorded, and
// records and logs a change. Events may be dropped by the connection, never
// the status it reads.
func (c *Consumer) checkConn() {
	lost := c.connLost.Load()
	switch up := c.nc.IsConnected(); {
	case up && lost != nil:
		if c.connLost.CompareAndSwap(lost, nil) {
			c.log.Info("natsdedup: connection to the NATS server back", slog.String("lost_for", lostFor(lost)),
				slog.String("server", c.nc.ConnectedUrlRedacted()))
		}
	case !up && lost == nil:
		l := &connLoss{since: time.Now(), err: c.nc.LastError()}
		if c.connLost.CompareAndSwap(nil, l) {
			c.log.Warn("natsdedup: connection to the NATS server lost; nothing is pulled nor acknowledged until it is back",
				slog.String("status", c.nc.Status().String()), slog.Any("error", l.err))
		}
	}
}

// connHealth returns nil, or an error matching [ErrOutage] while the
// connection is lost.
func (c *Consumer) connHealth() error {
	l := c.connLost.Load()
	if l == nil {
		return nil
	}
	msg := fmt.Sprintf("natsdedup: connection to the NATS server lost for %s (since %s, %s)",
		lostFor(l), l.since.UTC().Format(time.RFC3339), c.nc.Status())
	if l.err != nil {
		msg += ": " + l.err.Error()
	}
	return &outage.Error{Msg: msg, Err: l.err}
}

func lostFor(l *connLoss) string { return time.Since(l.since).Round(time.Millisecond).String() }
