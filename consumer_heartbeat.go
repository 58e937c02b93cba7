package dedup

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// heartbeat extends one attempt's lease every third of its length while the
// handler runs, and cancels the handler if the lease is lost. Heartbeats are
// pooled per wrapper with their timer, so an attempt costs no allocation here.
type heartbeat struct {
	store  Store
	logger *slog.Logger

	mu  sync.Mutex // guards the fields below
	ctx context.Context
	// detached says that the claim is held in ctx without its
	// cancellation: a front end's caller leaving gives the work to nobody
	// else, so the claim is held until the handler returns, whether anyone
	// waits for its answer or not, and a retry never runs beside it. A
	// consumer's transport cancels ctx once it may give the message to
	// another consumer, which ends the holding.
	detached bool
	cancel   context.CancelCauseFunc
	key      Key
	owner    string
	lease    time.Duration
	timer    *time.Timer
	stopped  bool
	// endBeat cancels the extension in progress, if any: once the attempt
	// is over, its outcome's write must not wait for it.
	endBeat context.CancelFunc
	running sync.WaitGroup // extensions in progress
}

// start arms h for one attempt, whose handler runs in ctx.
func (h *heartbeat) start(ctx context.Context, detached bool, cancel context.CancelCauseFunc, key Key, owner string, lease time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ctx, h.detached, h.cancel, h.key, h.owner, h.lease, h.stopped = ctx, detached, cancel, key, owner, lease, false
	if h.timer == nil {
		h.timer = time.AfterFunc(lease/3, h.beat)
	} else {
		h.timer.Reset(lease / 3)
	}
}

func (h *heartbeat) beat() {
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		return
	}
	h.running.Add(1)
	held := h.ctx
	if h.detached { // made here, once a beat is due, rather than per attempt
		held = context.WithoutCancel(held)
	}
	ctx, endBeat := context.WithCancel(held)
	h.endBeat = endBeat
	cancel, key, owner, lease := h.cancel, h.key, h.owner, h.lease
	h.mu.Unlock()
	defer h.running.Done()
	defer endBeat()

	err := h.store.Extend(ctx, key, owner, lease)
	switch {
	case errors.Is(err, ErrLeaseLost):
		cancel(err) // the store's error names the operation and key
		return
	case err != nil && ctx.Err() == nil:
		h.logger.Warn("dedup: lease extension failed", slog.Any("key", key), slog.Any("error", err))
	}
	h.mu.Lock()
	if !h.stopped {
		h.timer.Reset(lease / 3)
	}
	h.mu.Unlock()
}

// stop disarms h, cancels an extension in progress and waits for it, so
// nothing of the attempt outlives it.
func (h *heartbeat) stop() {
	h.mu.Lock()
	h.stopped = true
	h.timer.Stop()
	if h.endBeat != nil {
		h.endBeat()
	}
	h.ctx, h.cancel, h.endBeat = nil, nil, nil
	h.mu.Unlock()
	h.running.Wait()
}
