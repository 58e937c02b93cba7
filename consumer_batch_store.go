package dedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// storeRunner runs a batch on the store claim path: a segment's keys are
// claimed in one store call, and its successes completed by the batch's
// completer (with batch completion, together, in as few writes as the wait
// allows).
type storeRunner[M any] struct {
	b        *batch[M]
	from, to int
	claims   []Claim // the store's answer to the open segment's claim
	at       []int   // per delivery from from: its claim in claims, or -1 (claimed when run)
	// takenOver is a claim of a key taken over from a worker that died,
	// kept for the segment of its own that it starts at takenAt.
	takenOver *Claim
	takenAt   int
	// alone is set once a key was taken over: each success from then on is
	// completed on its own, because the claims given back behind it no
	// longer show that their worker died.
	alone     bool
	claimedAt time.Time
}

func newStoreRunner[M any](b *batch[M]) batchRunner[M] { return &storeRunner[M]{b: b} }

// open claims the segment's keys in one call. A key taken over from a
// worker that died may kill this one too: the segment ends before it, so
// that the successes before it are made durable first, and it runs in a
// segment of its own; the claims behind it are given back and claimed again
// once it is settled, so that a crash loop does not count an attempt for
// messages that never ran (and after a few deaths park them).
func (r *storeRunner[M]) open(ctx context.Context, from int) (int, error) {
	b := r.b
	r.from, r.claims, r.at = from, r.claims[:0], r.at[:0]
	if r.takenOver != nil && r.takenAt == from {
		r.to, r.alone = from+1, true
		r.claims, r.at = append(r.claims, *r.takenOver), append(r.at, 0)
		r.takenOver = nil
		return r.to, nil
	}
	r.to = b.segmentEnd(from, len(b.ds))
	reqs := b.reqs[:0]
	for i := from; i < r.to; i++ {
		if b.claims(i) {
			reqs = append(reqs, b.ds[i].request(b.w.cfg.ttl))
		}
	}
	b.reqs = reqs
	if len(reqs) <= 1 {
		return r.to, nil // claimed when it runs
	}
	r.claimedAt = time.Now()
	claims, err := b.w.store.ClaimBatch(ctx, reqs)
	if err != nil {
		return 0, err
	}
	if len(claims) != len(reqs) {
		return 0, fmt.Errorf("dedup: batch claim of %d keys answered %d", len(reqs), len(claims))
	}
	r.claims = claims
	for i, k := from, 0; i < r.to; i++ {
		at := -1
		if b.claims(i) {
			at, k = k, k+1
		}
		r.at = append(r.at, at)
	}
	for i := from; i < r.to; i++ {
		k := r.at[i-from]
		if k < 0 {
			continue
		}
		c := &r.claims[k]
		if c.Status != ClaimAcquired || c.Previous != StatusProcessing {
			continue
		}
		end := i
		if i == from {
			end, r.alone = i+1, true
		} else {
			taken := *c
			r.takenOver, r.takenAt = &taken, i
			r.at[i-from] = -1
		}
		r.release(ctx, i+1)
		r.to = end
		break
	}
	return r.to, nil
}

// settle settles delivery i with its claim, or claims it now.
func (r *storeRunner[M]) settle(ctx context.Context, i int) (pendingResult, next) {
	w, d := r.b.w, &r.b.ds[i]
	p := pendingResult{i: i, on: -1}
	k := i - r.from
	if k >= len(r.at) || r.at[k] < 0 {
		p.res, p.err = w.process(ctx, d)
		return p, carryOn
	}
	c := r.claims[r.at[k]]
	r.at[k] = -1
	if c.Status == ClaimAcquired && time.Since(r.claimedAt) > d.leaseTime/2 {
		// Earlier messages of the batch took a while: renew before running.
		if err := w.store.Extend(ctx, d.key, c.Record.Owner, d.leaseTime); err != nil {
			if errors.Is(err, ErrLeaseLost) {
				p.res, p.err = w.process(ctx, d)
				return p, carryOn
			}
			// It never ran: give the claim back, so that its next claim
			// does not count a worker's death.
			_ = w.store.Release(ctx, d.key, c.Record.Owner)
			p.res, p.err = Result{Key: d.key}, err
			return p, carryOn
		}
	}
	var att attempt[M] = storeAttempt[M]{w}
	if !r.alone {
		att = r.b.done.attempt(i)
	}
	p.res, p.err = w.settle(ctx, d, c, att)
	return p, carryOn
}

func (r *storeRunner[M]) settled(ctx context.Context, p pendingResult) bool {
	return r.b.settled(ctx, p)
}

func (r *storeRunner[M]) close(context.Context) next { return carryOn }

func (r *storeRunner[M]) abandon(ctx context.Context, i int) (int, bool) {
	r.release(ctx, i)
	return i, true
}

// release gives back the acquired claims of the open segment's deliveries
// from index i on, which will not run, and the claim of a key taken over
// that has not run yet.
func (r *storeRunner[M]) release(ctx context.Context, i int) {
	ctx, cancel := r.b.w.settleCtx(ctx, settleTimeout)
	defer cancel()
	give := func(c *Claim) {
		if c.Status != ClaimAcquired {
			return
		}
		if err := r.b.w.store.Release(ctx, c.Record.Key, c.Record.Owner); err != nil {
			r.b.w.cfg.logger.Warn("dedup: releasing an unstarted claim failed; it frees when its lease expires",
				slog.Any("key", c.Record.Key), slog.Any("error", err))
		}
	}
	for k := max(i-r.from, 0); k < len(r.at); k++ {
		if j := r.at[k]; j >= 0 {
			r.at[k] = -1
			give(&r.claims[j])
		}
	}
	if r.takenOver != nil && r.takenAt >= i {
		give(r.takenOver)
		r.takenOver = nil
	}
}
