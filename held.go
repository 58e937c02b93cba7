package dedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/dedupkit/dedup/internal/inmodule"
	"github.com/dedupkit/dedup/internal/nilcheck"
)

// held is a claim acquired from a [Store] by a front end that settles it
// itself, idemhttp's middleware (through internal/inmodule), kept by the
// rules a [Wrapper] keeps its own by: its lease is extended while the work
// runs, and its outcome is written fenced on the claim, tried again while
// the lease lasts, and counted as written when an earlier try landed though
// its answer was lost.
type held struct {
	store  Store
	key    Key
	owner  string
	lease  time.Duration
	logger *slog.Logger
}

func init() { inmodule.Hold = hold }

// hold returns c, a claim acquired from store with lease, held; logger
// receives what the heartbeat and the settling writes have to say (nil:
// slog.Default()).
func hold(store Store, c Claim, lease time.Duration, logger *slog.Logger) (inmodule.Held[Failure], error) {
	switch {
	case nilcheck.IsNil(store):
		return nil, fmt.Errorf("%w: hold: nil store", ErrConfig)
	case c.Status != ClaimAcquired || c.Record.Owner == "":
		return nil, fmt.Errorf("%w: hold: the claim of %s was not acquired (%v)", ErrConfig, c.Record.Key, c.Status)
	case lease <= 0:
		return nil, fmt.Errorf("%w: hold: lease %v must be positive", ErrConfig, lease)
	}
	if logger == nil {
		logger = slog.Default()
	}
	return &held{store: store, key: c.Record.Key, owner: c.Record.Owner, lease: lease, logger: logger}, nil
}

// Run runs fn while the claim is kept: the lease is extended every third of
// its length for as long as fn runs, even after ctx is cancelled (the work
// goes on whether anyone waits for it or not), and fn's context is
// cancelled with a cause matching ErrLeaseLost when another worker takes
// the key over. A panic in fn is returned as a *PanicError.
func (h *held) Run(ctx context.Context, fn func(ctx context.Context) error) (err error) {
	fctx, cancel := context.WithCancelCause(ctx)
	hb := &heartbeat{store: h.store, logger: h.logger}
	hb.start(context.WithoutCancel(ctx), cancel, h.key, h.owner, h.lease)
	defer func() {
		hb.stop() // an extension in progress ends before the settling writes
		cancel(nil)
	}()
	defer capturePanic(&err)
	return fn(fctx)
}

// Complete records the claim as succeeded with result, kept for ttl.
func (h *held) Complete(ctx context.Context, result []byte, ttl time.Duration) error {
	return retryHeld(ctx, h.logger, nil, h.lease, func(ctx context.Context, retried bool) error {
		return completeFenced(ctx, h.store, h.key, h.owner, result, ttl, retried)
	})
}

// Fail records a failed attempt, leaving the key retryable unless f.Final.
func (h *held) Fail(ctx context.Context, f Failure) error {
	return retryHeld(ctx, h.logger, nil, h.lease, func(ctx context.Context, retried bool) error {
		return failFenced(ctx, h.store, h.key, h.owner, f, retried)
	})
}

// completeFenced completes the claim of key by owner; a refusal after an
// earlier try (retried) counts as done when that try landed.
func completeFenced(ctx context.Context, store Store, key Key, owner string, result []byte, ttl time.Duration, retried bool) error {
	err := store.Complete(ctx, key, owner, result, ttl)
	if retried && errors.Is(err, ErrLeaseLost) && landed(ctx, store, key, owner) {
		return nil // an earlier try was applied but its answer lost
	}
	return err
}

// failFenced records a failure of the claim of key by owner, as
// completeFenced completes it.
func failFenced(ctx context.Context, store Store, key Key, owner string, f Failure, retried bool) error {
	err := store.Fail(ctx, key, owner, f)
	if retried && errors.Is(err, ErrLeaseLost) && landed(ctx, store, key, owner) {
		return nil
	}
	return err
}

// landed reports whether the record of key was settled by owner: still its
// token, no longer processing. Only owner settles its own claim, and a
// takeover replaces the token.
func landed(ctx context.Context, store Store, key Key, owner string) bool {
	if owner == "" {
		return false
	}
	rec, err := store.Get(ctx, key)
	return err == nil && rec.Owner == owner && rec.Status != StatusProcessing
}
