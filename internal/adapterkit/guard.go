package adapterkit

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/dedupkit/dedup/internal/outage"
)

// Stats is the type of a [Wrapper]'s Stats: dedup.Stats, which has the
// fields of outage.Snapshot, in their order.
type Stats interface {
	~struct {
		LastSuccess  time.Time
		LastFailure  time.Time
		LastError    error
		FailingSince time.Time
	}
}

// Wrapper is what a Run reads of the wrapper its deliveries go through: its
// outage tracker. *dedup.Wrapper satisfies it, with S dedup.Stats.
type Wrapper[S Stats] interface {
	// Health returns nil, or an error matching deduptype.ErrOutage during
	// an outage.
	Health() error
	// Stats returns what the wrapper knows of its recent attempts.
	Stats() S
}

// Guard is the give-up of one Run: its context, done once the caller's is
// or once the Run gives up (an outage lasting longer than its bound, a
// connection closed for good), the Outage its Policies check, and the
// error it gave up with.
type Guard struct {
	// Ctx is done once the caller's context is, or once the Run gives up
	// (GiveUp): poll until then.
	Ctx context.Context

	cancel context.CancelCauseFunc
	outage *Outage

	mu     sync.Mutex
	gaveUp error // the first error GiveUp was given
}

// NewGuard returns the Guard of a Run under ctx reading w's outage tracker,
// which gives up with an error matching deduptype.ErrOutage once failures
// have lasted longer than maxOutage (unless 0).
func NewGuard[S Stats](ctx context.Context, w Wrapper[S], maxOutage time.Duration) *Guard {
	g := &Guard{}
	g.Ctx, g.cancel = context.WithCancelCause(ctx)
	g.outage = NewOutage(w.Health, func() outage.Snapshot { return outage.Snapshot(w.Stats()) }, maxOutage, g.GiveUp)
	return g
}

// GiveUp stops the Run, which then returns err unless it gave up with
// another error first.
func (g *Guard) GiveUp(err error) {
	g.mu.Lock()
	if g.gaveUp == nil {
		g.gaveUp = err
	}
	g.mu.Unlock()
	g.cancel(err)
}

// NewPolicy returns a Policy with its own count of failures in a row,
// checking the Guard's outage: one per Run, or per Kafka partition.
func (g *Guard) NewPolicy(inFlightDelay time.Duration, backoff func(failures int) time.Duration) *Policy {
	return &Policy{InFlightDelay: inFlightDelay, Backoff: backoff, Outage: g.outage}
}

// End releases Ctx once the Run has shut down, and returns err, the
// shutdown's, joined after the error the Run gave up with, if any.
func (g *Guard) End(err error) error {
	g.cancel(nil)
	g.mu.Lock()
	defer g.mu.Unlock()
	return errors.Join(g.gaveUp, err)
}
