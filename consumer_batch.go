package dedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// HandleBatch processes msgs in order, claiming all their keys in one store
// call first, and calls yield with each message's index and result, in
// order, as soon as it is settled; with [WithBatchCompletion], a success is
// given to yield once its completion, written with others, is durable. When
// yield returns false, or ctx is done, it stops and gives back the claims of
// the messages not yet run. It returns an error, having processed nothing,
// only when the batch claim itself fails.
func (w *Wrapper[M]) HandleBatch(ctx context.Context, msgs []M, yield func(i int, res Result, err error) bool) error {
	ds := make([]delivery[M], len(msgs))
	reqs := make([]ClaimRequest, 0, len(msgs))
	for i, m := range msgs {
		ds[i] = w.prepare(ctx, m)
		if ds[i].bad == "" {
			reqs = append(reqs, ds[i].request(w.cfg.ttl))
		}
	}
	if w.inbox != nil || len(reqs) <= 1 {
		for i := range ds {
			if ctx.Err() != nil {
				return nil
			}
			res, err := w.finish(ctx, &ds[i])
			if !yield(i, res, err) {
				return nil
			}
		}
		return nil
	}
	claimedAt := time.Now()
	claims, err := w.store.ClaimBatch(ctx, reqs)
	if err != nil {
		return fmt.Errorf("dedup: batch claim of %d keys: %w", len(reqs), err)
	}
	if len(claims) != len(reqs) {
		return fmt.Errorf("dedup: batch claim of %d keys answered %d", len(reqs), len(claims))
	}
	b := &batch[M]{w: w, ds: ds, claims: make([]*Claim, len(ds)), yield: yield,
		seen: make(map[Key]struct{}, len(reqs)), claimedAt: claimedAt}
	b.settled = make(map[Key]settledCopy)
	next := 0
	for i := range ds {
		if ds[i].bad == "" {
			b.claims[i] = &claims[next]
			next++
		}
	}
	if bc, ok := w.store.(BatchCompleter); ok && w.cfg.batchCompletion {
		b.completer = bc
	}
	b.run(ctx)
	return nil
}

// batch is the progress of one HandleBatch after its claim.
type batch[M any] struct {
	w         *Wrapper[M]
	ds        []delivery[M]
	claims    []*Claim // per delivery; nil for a message that cannot be claimed
	yield     func(i int, res Result, err error) bool
	seen      map[Key]struct{}
	claimedAt time.Time
	// settled holds the keys of this batch whose copy was processed or
	// dead-lettered: a later copy is a duplicate of it, known without
	// asking the store.
	settled map[Key]settledCopy
	// completer is set when successes are completed together.
	completer BatchCompleter
	// pending are the results not yet given to yield, in order. The first
	// len(comps) successes among them wait for their completion in comps.
	pending []pendingResult
	comps   []Completion
	flushBy time.Time // when comps must be written, at the latest
}

type pendingResult struct {
	i    int
	res  Result
	err  error
	comp int  // index into comps, or -1
	dup  bool // a duplicate of an earlier copy, valid once comp is written
}

type settledCopy struct {
	attempts int
	comp     int // its deferred completion, or -1 once written
}

func (b *batch[M]) run(ctx context.Context) {
	reclaimAt := -1 // claim the messages from here on again, in one call
	for i := range b.ds {
		if i == reclaimAt {
			b.reclaim(ctx, i)
		}
		d, c := &b.ds[i], b.claims[i]
		due := len(b.comps) > 0 && !time.Now().Before(b.flushBy)
		if ctx.Err() != nil || due {
			if !b.flush(ctx) || ctx.Err() != nil {
				b.releaseFrom(ctx, i)
				return
			}
		}
		if c != nil && c.Status == ClaimAcquired && c.Previous == StatusProcessing && i+1 < len(b.ds) {
			// A worker died running this key, and this attempt may kill its
			// worker too. Claims held behind it would then count an attempt
			// for messages that never ran, and after a few such deaths park
			// them as a crash loop: give them back, and claim those messages
			// one by one once this one is settled.
			b.releaseFrom(ctx, i+1)
			clear(b.claims[i+1:])
			reclaimAt = i + 1
		}
		res, comp, err := b.handle(ctx, d, c)
		dup := c != nil && c.Status == ClaimInFlight && res.Outcome == Duplicate
		b.pending = append(b.pending, pendingResult{i: i, res: res, err: err, comp: comp, dup: dup})
		if err == nil && !dup && (res.Outcome == Processed || res.Outcome == DeadLettered) {
			b.settled[d.key] = settledCopy{attempts: res.Attempts, comp: comp}
		}
		if b.completer == nil || err != nil || !res.Settled() {
			if !b.flush(ctx) {
				b.releaseFrom(ctx, i+1)
				return
			}
		}
	}
	b.flush(ctx)
}

// reclaim claims the messages from index i on in one store call, after
// their first claims were given back; on failure they are claimed one by one.
func (b *batch[M]) reclaim(ctx context.Context, i int) {
	reqs := make([]ClaimRequest, 0, len(b.ds)-i)
	for j := i; j < len(b.ds); j++ {
		if b.ds[j].bad == "" {
			reqs = append(reqs, b.ds[j].request(b.w.cfg.ttl))
		}
	}
	if len(reqs) == 0 {
		return
	}
	b.claimedAt = time.Now()
	claims, err := b.w.store.ClaimBatch(ctx, reqs)
	if err != nil || len(claims) != len(reqs) {
		return
	}
	for j, k := i, 0; j < len(b.ds); j++ {
		if b.ds[j].bad == "" {
			b.claims[j] = &claims[k]
			k++
		}
	}
}

// handle settles one message whose claim was made up front (c), or claims
// it now (c nil). comp is the index of its deferred completion, or -1.
func (b *batch[M]) handle(ctx context.Context, d *delivery[M], c *Claim) (res Result, comp int, err error) {
	w := b.w
	if c == nil {
		res, err := w.finish(ctx, d)
		return res, -1, err
	}
	_, again := b.seen[d.key]
	b.seen[d.key] = struct{}{}
	switch {
	case c.Status == ClaimInFlight && again:
		// The batch's own earlier copy held the key at claim time.
		if e, ok := b.settled[d.key]; ok {
			res := Result{Outcome: Duplicate, Key: d.key, Attempts: e.attempts}
			if e.comp < 0 && w.cfg.observer != nil {
				w.cfg.observer(ctx, res)
			}
			return res, e.comp, nil
		}
		// It did not settle for good: claim afresh.
		res, err := w.finish(ctx, d)
		return res, -1, err
	case c.Status == ClaimAcquired && time.Since(b.claimedAt) > d.leaseTime/2:
		// Earlier messages of the batch took a while: renew before running.
		if err := w.store.Extend(ctx, d.key, c.Record.Owner, d.leaseTime); err != nil {
			if errors.Is(err, ErrLeaseLost) {
				res, err := w.finish(ctx, d)
				return res, -1, err
			}
			return Result{Key: d.key}, -1, fmt.Errorf("dedup: extend %s: %w", d.key, err)
		}
	}
	var later *[]Completion
	if b.completer != nil {
		later = &b.comps
	}
	n := len(b.comps)
	res, err = w.settleClaimLater(ctx, d, *c, later)
	if len(b.comps) > n {
		if n == 0 {
			b.flushBy = time.Now().Add(min(w.cfg.batchWait, d.leaseTime/3))
		}
		return res, n, err
	}
	if err == nil && w.cfg.observer != nil {
		w.cfg.observer(ctx, res)
	}
	return res, -1, err
}

// flush writes the deferred completions, then gives the pending results to
// yield in order. It returns false when yield asked to stop.
func (b *batch[M]) flush(ctx context.Context) bool {
	w := b.w
	var errs []error
	var werr error
	if len(b.comps) > 0 {
		sctx, cancel := settleContext(ctx)
		errs, werr = b.completeHeld(sctx)
		cancel()
	}
	pending := b.pending
	b.pending, b.comps = b.pending[:0], b.comps[:0]
	for _, p := range pending {
		if p.comp >= 0 {
			cerr := werr
			if cerr == nil {
				cerr = errs[p.comp]
			}
			switch {
			case cerr != nil && p.dup:
				p.res.Outcome = 0
				p.err = fmt.Errorf("dedup: %s: its earlier copy in the batch was not recorded: %w", p.res.Key, cerr)
			case cerr != nil:
				p.res.Outcome = 0
				p.err = w.settleError("complete", p.res.Key, cerr)
				delete(b.settled, p.res.Key)
			default:
				if !p.dup {
					b.settled[p.res.Key] = settledCopy{attempts: p.res.Attempts, comp: -1}
				}
				if w.cfg.observer != nil {
					w.cfg.observer(ctx, p.res)
				}
			}
		}
		if !b.yield(p.i, p.res, p.err) {
			return false
		}
	}
	return true
}

// completeHeld writes the pending completions, trying again as settleHeld
// does while the claims hold: the handlers ran, and giving up would run them
// again once the leases lapsed. A completion refused after an earlier try
// whose answer was lost counts as done when it landed.
func (b *batch[M]) completeHeld(ctx context.Context) ([]error, error) {
	deadline := time.Now().Add(b.ds[0].leaseTime)
	wait := settleRetryMin
	for tries := 1; ; tries++ {
		errs, err := b.completer.CompleteBatch(ctx, b.comps)
		if err == nil && len(errs) != len(b.comps) {
			return nil, fmt.Errorf("dedup: batch completion of %d answered %d", len(b.comps), len(errs))
		}
		if err == nil {
			for i, cerr := range errs {
				if tries > 1 && errors.Is(cerr, ErrLeaseLost) && b.w.landed(ctx, b.comps[i].Key, b.comps[i].Owner) {
					errs[i] = nil
				}
			}
			return errs, nil
		}
		if ctx.Err() != nil || time.Now().Add(wait).After(deadline) {
			return nil, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		wait = min(2*wait, settleRetryMax)
	}
}

// releaseFrom gives back the acquired claims of the messages from index i
// on, which will not run.
func (b *batch[M]) releaseFrom(ctx context.Context, i int) {
	ctx, cancel := settleContext(ctx)
	defer cancel()
	for _, c := range b.claims[i:] {
		if c == nil || c.Status != ClaimAcquired {
			continue
		}
		if err := b.w.store.Release(ctx, c.Record.Key, c.Record.Owner); err != nil {
			b.w.cfg.logger.Warn("dedup: releasing an unstarted claim failed; it frees when its lease expires",
				slog.String("key", c.Record.Key.String()), slog.Any("error", err))
		}
	}
}
