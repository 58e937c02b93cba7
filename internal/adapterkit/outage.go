package adapterkit

import (
	"log/slog"
	"time"

	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/outage"
)

// Outage is what a Run knows of the wrapper's outage tracker, and its bound
// on an outage: the one place a delivery not settled is checked against it.
type Outage struct {
	health    func() error
	stats     func() outage.Snapshot
	maxOutage time.Duration
	giveUp    func(error)
}

// NewOutage returns an Outage reading the wrapper's Health and Stats, which
// calls giveUp once failures have lasted longer than maxOutage (unless 0).
func NewOutage(health func() error, stats func() outage.Snapshot, maxOutage time.Duration, giveUp func(error)) *Outage {
	return &Outage{health: health, stats: stats, maxOutage: maxOutage, giveUp: giveUp}
}

// Failed is called when a delivery could not be settled (the wrapper has
// recorded the failure): it stops Run once failures have lasted longer than
// the bound on an outage, and returns the level to log the delivery at.
func (o *Outage) Failed() slog.Level {
	level, stop := outage.Failed(o.health(), o.stats(), o.maxOutage, deduptype.ErrOutage)
	if stop != nil {
		o.giveUp(stop)
	}
	return level
}
