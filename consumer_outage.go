package dedup

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultOutageThreshold is how long deliveries must keep failing to be
// made durable before a wrapper reports an outage, unless
// [WithOutageThreshold] says otherwise.
const DefaultOutageThreshold = 30 * time.Second

// outage follows the deliveries whose outcome could not be made durable (the
// store or the sink failing): one failure is routine and logged where it
// happens, but failures lasting past the threshold are reported once at
// ERROR, and the recovery once at INFO, instead of a line per delivery.
type outage struct {
	since atomic.Int64 // unix nanoseconds of the first failure in a row; 0 when healthy

	mu       sync.Mutex // guards the fields below
	last     error
	reported bool
}

// observe records the result of one delivery.
func (o *outage) observe(ctx context.Context, logger *slog.Logger, threshold time.Duration, err error) {
	switch {
	case err == nil:
		if o.since.Load() == 0 {
			return // the hot path: healthy and staying so
		}
		o.mu.Lock()
		since := o.since.Swap(0)
		if o.reported && since != 0 {
			logger.Info("dedup: deliveries are recorded again after an outage",
				slog.Duration("outage", time.Since(time.Unix(0, since)).Round(time.Millisecond)))
		}
		o.last, o.reported = nil, false
		o.mu.Unlock()
		return
	case errors.Is(err, ErrLeaseLost), ctx.Err() != nil:
		return // another worker's progress, or shutting down: not an outage
	}
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.last = err
	o.since.CompareAndSwap(0, now.UnixNano())
	since := time.Unix(0, o.since.Load())
	if !o.reported && now.Sub(since) >= threshold {
		o.reported = true
		logger.Error("dedup: the store or dead-letter sink has been failing; deliveries are not acknowledged and come back",
			slog.Duration("for", now.Sub(since).Round(time.Millisecond)), slog.Any("error", err))
	}
}

// state returns when the current run of failures began and its latest
// error, or a zero time when the last delivery was made durable.
func (o *outage) state() (time.Time, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	since := o.since.Load()
	if since == 0 {
		return time.Time{}, nil
	}
	return time.Unix(0, since), o.last
}

// Outage reports whether the wrapper's deliveries are failing to be made
// durable (the store or the dead-letter sink unreachable): since is when the
// current run of failures began and err the latest one, or since is zero
// when the latest delivery was recorded. A readiness probe can call it; a
// lease lost to another worker or a cancelled context is no outage.
func (w *Wrapper[M]) Outage() (since time.Time, err error) { return w.outage.state() }
