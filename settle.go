package dedup

import (
	"context"
	"errors"
	"time"
)

// Bounds of the waits between tries of a settling write, and of how long it
// is tried (the lease, when that is longer).
const (
	settleRetryMin = 50 * time.Millisecond
	settleRetryMax = time.Second
	settleRetryFor = 30 * time.Second
)

// settleHeld makes write, a store write fenced on owner (Complete or Fail)
// that records the outcome of an attempt that ran, durable. A write that
// fails for another reason than a lost lease is tried again, for up to
// 30 s or the lease if longer, while ctx lasts: unless another worker took
// the claim over (which the fencing reports), waiting for the store to come
// back records the outcome once, where giving up would have the message
// redelivered and the handler, whose effect is already applied, run again
// once the lease lapsed.
func (w *Wrapper[M]) settleHeld(ctx context.Context, d *delivery[M], owner string, write func(context.Context) error) error {
	deadline := time.Now().Add(max(d.leaseTime, settleRetryFor))
	wait := settleRetryMin
	for tries := 1; ; tries++ {
		err := write(ctx)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, ErrLeaseLost):
			if tries > 1 && w.landed(ctx, d.key, owner) {
				return nil // an earlier try was applied but its answer lost
			}
			return err
		case ctx.Err() != nil || time.Now().Add(wait).After(deadline):
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, settleRetryMax)
	}
}

// landed reports whether the record of key was settled by owner: still its
// token, no longer processing. Only owner settles its own claim, and a
// takeover replaces the token.
func (w *Wrapper[M]) landed(ctx context.Context, key Key, owner string) bool {
	rec, err := w.store.Get(ctx, key)
	return err == nil && rec.Owner == owner && rec.Status != StatusProcessing
}
