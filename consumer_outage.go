package dedup

import (
	"context"
	"errors"
	"time"

	"github.com/dedupkit/dedup/deduptype"
)

// defaultOutageThreshold is how long deliveries must keep failing to be
// made durable before a wrapper reports an outage, unless
// [WithOutageThreshold] says otherwise.
const defaultOutageThreshold = 30 * time.Second

// ErrOutage is matched by [Wrapper.Health]'s error while deliveries have
// kept failing to be made durable (the store or the dead-letter sink
// unreachable) for [WithOutageThreshold] or longer; the transport adapters'
// Health and Run report outages with it too.
var ErrOutage = deduptype.ErrOutage

// Stats is what a [Wrapper] knows of its recent attempts to make a
// delivery's outcome durable: recorded in the store and, for a dead letter,
// sent to the sink.
type Stats struct {
	// LastSuccess is when a delivery's outcome was last made durable.
	LastSuccess time.Time
	// LastFailure is when that last failed, and LastError why.
	LastFailure time.Time
	LastError   error
	// FailingSince is when the current run of failures began; zero when
	// the latest attempt succeeded.
	FailingSince time.Time
}

// observeOutcome feeds the outage tracker one delivery's result, and
// reports whether it was a success, for the caller to stamp once per call
// (see outage.Tracker.Success). A lease lost to another worker, a context
// cancelled by a shutdown, or an error the handler caused (handlerFault) is
// no failure of the store.
func (w *Wrapper[M]) observeOutcome(ctx context.Context, err error) bool {
	switch {
	case err == nil:
		w.health.Success()
		return true
	case errors.Is(err, ErrLeaseLost), ctx.Err() != nil, isHandlerFault(err):
	default:
		w.health.Failure(err)
	}
	return false
}

// isHandlerFault reports whether err is marked as the handler's fault. Kept
// out of observeOutcome so that the target of errors.As escapes to the heap
// only for an error.
func isHandlerFault(err error) bool {
	var fault handlerFault
	return errors.As(err, &fault)
}

// Stats returns what w knows of its recent attempts to make deliveries
// durable, for every transport consuming through it.
func (w *Wrapper[M]) Stats() Stats {
	return Stats(w.health.Snapshot())
}

// Health returns nil, or an error matching [ErrOutage] (and wrapping the
// latest failure) while deliveries have kept failing to be made durable for
// [WithOutageThreshold] or longer: a readiness probe can serve it. A wrapper
// that has handled nothing yet is healthy; a lease lost to another worker or
// a cancelled context is no outage.
func (w *Wrapper[M]) Health() error { return w.health.Health() }
