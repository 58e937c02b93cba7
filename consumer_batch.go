package dedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
)

// HandleBatch processes msgs in order, claiming all their keys in one store
// call first, and calls yield with each message's index and result, in
// order, as soon as it is settled; with batch completion (the default, see
// [WithBatchCompletion]), a success is given to yield once its completion,
// written with others, is durable. When yield returns false, or ctx is done,
// it stops and gives back the claims of the messages not yet run; the
// settled results written together with the one yield stopped at are still
// given to it, up to the first result that is not settled. It returns an error, having processed nothing,
// only when the batch claim itself fails.
//
// A key the batch holds more than once is sent to the store once: a later
// copy gets its answer from the first copy's outcome (OutcomeDuplicate once
// that is settled, the same OutcomeRetry or OutcomeInFlight otherwise), or,
// when its payload differs, from a claim of its own made after the first
// copy settled.
func (w *Wrapper[M]) HandleBatch(ctx context.Context, msgs []M, yield func(i int, res Result, err error) bool, opts ...CallOpt) error {
	call := callOptions(opts)
	b := &batch[M]{w: w, ds: make([]delivery[M], len(msgs)), claims: make([]*Claim, len(msgs)),
		first: make([]int, len(msgs)), outcomes: make([]pendingResult, len(msgs)), yield: yield, stop: call.stop}
	if w.tel != nil {
		defer b.endSpans()
	}
	var firsts map[Key]int
	for i, m := range msgs {
		b.ds[i] = w.prepare(ctx, m, &call)
		b.first[i] = -1
		if b.ds[i].bad != "" || len(msgs) == 1 {
			continue
		}
		if firsts == nil {
			firsts = make(map[Key]int, len(msgs))
		}
		if f, ok := firsts[b.ds[i].key]; ok {
			b.first[i] = f
		} else {
			firsts[b.ds[i].key] = i
		}
	}
	if s, ok := w.steps.(inboxSteps[M]); ok && !w.cfg.txPerEvent && len(msgs) > 1 {
		s.runBatch(ctx, b)
		return nil
	}
	if w.batchClaims {
		if err := b.claim(ctx, 0); err != nil {
			return err
		}
		if bc, ok := w.store.(BatchCompleter); ok && w.cfg.batchWait > 0 {
			b.completer = bc
		}
	}
	b.run(ctx)
	return nil
}

// stopped reports whether the transport asked the batch to stop.
func (b *batch[M]) stopped() bool {
	select {
	case <-b.stop:
		return true
	default:
		return false
	}
}

// endSpans ends the spans of the deliveries given no result: the batch
// stopped before them (a failed claim, a cancelled context, yield asking to
// stop), and they come back.
func (b *batch[M]) endSpans() {
	for i := range b.ds {
		if span := b.ds[i].span; span != nil {
			span.SetAttributes(attribute.String("dedup.outcome", "unsettled"))
			span.End()
		}
	}
}

// batch is the progress of one HandleBatch.
type batch[M any] struct {
	w      *Wrapper[M]
	ds     []delivery[M]
	claims []*Claim // per delivery; nil for one not claimed up front
	// first is, per delivery, the index of the batch's first copy of its key
	// when it is a later copy, else -1.
	first []int
	// outcomes are the results of the deliveries run so far.
	outcomes []pendingResult
	yield    func(i int, res Result, err error) bool
	stop     <-chan struct{} // CallStop's; nil: none
	// alone is set once a key was taken over from a worker that died: each
	// success from then on is completed on its own.
	alone     bool
	claimedAt time.Time
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
	dup  bool // a later copy answered from its first, valid once comp is written
}

// claim claims, in one store call, the keys of the deliveries from index
// from on that are first copies. With at most one such key, each is
// claimed when it runs.
func (b *batch[M]) claim(ctx context.Context, from int) error {
	var reqs []ClaimRequest
	for j := from; j < len(b.ds); j++ {
		if b.ds[j].bad == "" && b.first[j] < 0 {
			reqs = append(reqs, b.ds[j].request(b.w.cfg.ttl))
		}
	}
	if len(reqs) <= 1 {
		return nil
	}
	b.claimedAt = time.Now()
	claims, err := b.w.store.ClaimBatch(ctx, reqs)
	if err != nil {
		b.w.observeOutcome(ctx, err)
		return err
	}
	if len(claims) != len(reqs) {
		return fmt.Errorf("dedup: batch claim of %d keys answered %d", len(reqs), len(claims))
	}
	for j, k := from, 0; j < len(b.ds); j++ {
		if b.ds[j].bad == "" && b.first[j] < 0 {
			b.claims[j] = &claims[k]
			k++
		}
	}
	return nil
}

func (b *batch[M]) run(ctx context.Context) {
	reclaimAt := -1 // claim the messages from here on again, in one call
	for i := range b.ds {
		if i == reclaimAt {
			_ = b.claim(ctx, i) // on failure they are claimed one by one
		}
		d, c := &b.ds[i], b.claims[i]
		due := len(b.comps) > 0 && !time.Now().Before(b.flushBy)
		// A copy with another payload asks the store, which must see its
		// first copy's completion.
		ownClaim := b.first[i] >= 0 && d.fp != b.ds[b.first[i]].fp
		// A key taken over from a worker that died may kill this one too:
		// the successes before it are made durable first, and it is
		// completed on its own, so that a crash loop does not repeat them.
		takeover := c != nil && c.Status == ClaimAcquired && c.Previous == StatusProcessing
		// The claims given back behind it no longer show that their worker
		// died: the rest of the batch is completed one event at a time.
		b.alone = b.alone || takeover
		stop := ctx.Err() != nil || b.stopped()
		if stop || due || (ownClaim || takeover) && len(b.comps) > 0 {
			if !b.flush(ctx) || stop {
				b.releaseFrom(ctx, i)
				return
			}
		}
		if takeover && i+1 < len(b.ds) {
			// A worker died running this key, and this attempt may kill its
			// worker too. Claims held behind it would then count an attempt
			// for messages that never ran, and after a few such deaths park
			// them as a crash loop: give them back, and claim those messages
			// again once this one is settled.
			b.releaseFrom(ctx, i+1)
			clear(b.claims[i+1:])
			reclaimAt = i + 1
		}
		var p pendingResult
		if b.first[i] >= 0 && !ownClaim {
			p = b.copyOf(i)
		} else {
			p = pendingResult{i: i, comp: -1}
			p.res, p.comp, p.err = b.handle(ctx, d, c, b.alone)
		}
		b.outcomes[i] = p
		b.pending = append(b.pending, p)
		if b.completer == nil || p.err != nil || !p.res.Settled() {
			if !b.flush(ctx) {
				b.releaseFrom(ctx, i+1)
				return
			}
		}
	}
	b.flush(ctx)
}

// copyOf answers delivery i, a later copy of a key with the same payload,
// from the outcome of the key's first copy, without asking the store; a
// duplicate of a success waiting to be completed waits for that completion.
func (b *batch[M]) copyOf(i int) pendingResult {
	f := b.outcomes[b.first[i]]
	p := pendingResult{i: i, comp: -1, err: f.err, res: copyResult(f.res)}
	if p.res.Outcome == OutcomeDuplicate {
		p.comp, p.dup = f.comp, f.comp >= 0
	}
	return p
}

// copyResult is the one rule for a later copy of a key in a batch, with the
// same payload as the first: once the first settled, a duplicate of it;
// otherwise the first's own answer (OutcomeRetry or OutcomeInFlight), so that
// the copy comes back too.
func copyResult(first Result) Result {
	switch first.Outcome {
	case OutcomeProcessed, OutcomeDeadLettered, OutcomeDuplicate, OutcomeConflict:
		return Result{Outcome: OutcomeDuplicate, Key: first.Key, Attempts: first.Attempts}
	}
	return first
}

// handle settles one message whose claim was made up front (c), or claims
// it now (c nil); alone completes it at once. comp is the index of its
// deferred completion, or -1.
func (b *batch[M]) handle(ctx context.Context, d *delivery[M], c *Claim, alone bool) (res Result, comp int, err error) {
	w := b.w
	if c == nil {
		res, err := w.process(ctx, d)
		return res, -1, err
	}
	if c.Status == ClaimAcquired && time.Since(b.claimedAt) > d.leaseTime/2 {
		// Earlier messages of the batch took a while: renew before running.
		if err := w.store.Extend(ctx, d.key, c.Record.Owner, d.leaseTime); err != nil {
			if errors.Is(err, ErrLeaseLost) {
				res, err := w.process(ctx, d)
				return res, -1, err
			}
			return Result{Key: d.key}, -1, err
		}
	}
	var later *[]Completion
	if b.completer != nil && !alone {
		later = &b.comps
	}
	n := len(b.comps)
	res, err = w.settle(ctx, d, *c, later)
	if len(b.comps) > n {
		if n == 0 {
			b.flushBy = time.Now().Add(min(w.cfg.batchWait, d.leaseTime/3))
		}
		return res, n, err
	}
	return res, -1, err
}

// flush writes the deferred completions, then gives the pending results to
// yield in order. Once yield asked to stop at a settled result, it still
// gives the settled results that follow, which ran and are durable, up to
// the first that is not, so that a transport stopping acknowledges what is
// done; yield stopping at an unsettled result gets nothing more. It returns
// false when yield asked to stop.
func (b *batch[M]) flush(ctx context.Context) bool {
	w := b.w
	var errs []error
	if len(b.comps) > 0 {
		sctx, cancel := settleContext(ctx)
		errs = w.completeHeld(sctx, b.completer, b.comps, b.ds[0].leaseTime)
		cancel()
	}
	pending := b.pending
	b.pending, b.comps = b.pending[:0], b.comps[:0]
	stopped, durable := false, false
	defer func() {
		if durable {
			w.health.Stamp()
		}
	}()
	for _, p := range pending {
		if p.comp >= 0 {
			if cerr := errs[p.comp]; cerr != nil {
				p.res.Outcome = 0
				p.err = w.settleError("complete", p.res.Key, cerr, !p.dup)
			}
			p.comp = -1
			b.outcomes[p.i] = p
		}
		if stopped && (p.err != nil || !p.res.Settled()) {
			break
		}
		durable = w.observe(ctx, &b.ds[p.i], p.res, p.err) || durable
		if !b.yield(p.i, p.res, p.err) {
			stopped = true
			if p.err != nil || !p.res.Settled() {
				break // what follows an unsettled result must not be acknowledged past it
			}
		}
	}
	return !stopped
}

// completeHeld writes comps with bc, trying again while the claims hold, as
// a single completion is: the handlers ran, and giving up would run them
// again once the leases lapsed. A store may answer some completions with an
// error of their own (a request of its batch failed): those are tried
// again, the others are done. A completion refused after an earlier try
// whose answer was lost counts as done when it landed. It returns one error
// per completion.
func (w *Wrapper[M]) completeHeld(ctx context.Context, bc BatchCompleter, comps []Completion, lease time.Duration) []error {
	errs := make([]error, len(comps))
	pending := make([]int, len(comps))
	for i := range pending {
		pending[i] = i
	}
	batch := comps
	err := w.retryHeld(ctx, lease, func(ctx context.Context, retried bool) error {
		res, err := bc.CompleteBatch(ctx, batch)
		if err != nil {
			return err
		}
		if len(res) != len(batch) {
			return unrepeatable{fmt.Errorf("dedup: batch completion of %d answered %d", len(batch), len(res))}
		}
		var again []int
		var retry error
		for k, i := range pending {
			cerr := res[k]
			if retried && errors.Is(cerr, ErrLeaseLost) && w.landed(ctx, comps[i].Key, comps[i].Owner) {
				cerr = nil
			}
			errs[i] = cerr
			if cerr != nil && !errors.Is(cerr, ErrLeaseLost) && !isUnrepeatable(cerr) {
				again, retry = append(again, i), cerr
			}
		}
		pending, batch = again, make([]Completion, len(again))
		for k, i := range again {
			batch[k] = comps[i]
		}
		return retry
	})
	if err != nil {
		for _, i := range pending {
			errs[i] = err
		}
	}
	return errs
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
