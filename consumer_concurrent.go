package dedup

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/dedupkit/dedup/deduptype"
)

// HandleConcurrent processes msgs, whose order does not matter (the
// messages of one SQS receive), claiming their keys in one store call and
// running their handlers concurrently; with batch completion (the default,
// see [WithBatchCompletion]) the successes are then completed together, in
// as few writes as the wait allows. Once every message is settled it calls
// yield with each one's index and result, in order. A key held more than
// once follows HandleBatch's rule (see [Wrapper.HandleBatch]): a later copy
// with the same payload is answered from the first copy's outcome, one with
// another payload is claimed on its own once the first copy settled. It
// returns an error, having processed nothing, only when the batch claim
// itself fails.
func (w *Wrapper[M]) HandleConcurrent(ctx context.Context, msgs []M, yield func(i int, res Result, err error), opts ...CallOpt) error {
	call := callOptions(opts)
	c := &concurrentBatch[M]{w: w, results: make([]pendingResult, len(msgs))}
	w.prepareBatch(ctx, msgs, &call, &c.prepared)
	if err := c.claim(ctx); err != nil {
		// One failed store call, which claim told the outage tracker of:
		// the deliveries' spans end with it.
		if w.tel != nil {
			for i := range c.ds {
				w.tel.end(ctx, c.ds[i].span, Result{Key: c.ds[i].key}, err)
			}
		}
		return err
	}
	c.run(ctx)
	c.answerCopies(ctx)
	durable := false
	for i := range c.ds {
		p := c.results[i]
		durable = w.observe(ctx, &c.ds[i], p.res, p.err) || durable
		yield(i, p.res, p.err)
	}
	if durable {
		w.health.Stamp()
	}
	return nil
}

// concurrentBatch is the progress of one HandleConcurrent.
type concurrentBatch[M any] struct {
	w *Wrapper[M]
	prepared[M]
	claims  []Claim
	claimOf []int // per delivery: its index in claims, or noClaim, or laterCopy
	results []pendingResult

	completer deduptype.BatchCompleter // nil: each success is completed on its own
	mu        sync.Mutex
	comps     []deduptype.Completion // successes waiting to be completed
	compOf    []int                  // their deliveries
}

const (
	noClaim   = -1 // claimed when it runs, or not at all (bad input)
	laterCopy = -2 // a key held earlier in the batch
)

// claim claims the first copies' keys in one store call when there are at
// least two and the wrapper claims from a store.
func (c *concurrentBatch[M]) claim(ctx context.Context) error {
	w := c.w
	c.claimOf = make([]int, len(c.ds))
	var reqs []ClaimRequest
	for i := range c.ds {
		d := &c.ds[i]
		c.claimOf[i] = noClaim
		switch {
		case d.bad != "":
		case c.first[i] >= 0:
			c.claimOf[i] = laterCopy
		case w.batchClaim != nil:
			c.claimOf[i] = len(reqs)
			reqs = append(reqs, d.request(w.cfg.ttl))
		}
	}
	if len(reqs) < 2 {
		for i, k := range c.claimOf {
			if k >= 0 {
				c.claimOf[i] = noClaim
			}
		}
		return nil
	}
	claims, err := w.batchClaim(ctx, reqs)
	if err != nil {
		w.observeOutcome(ctx, err)
		return err
	}
	if len(claims) != len(reqs) {
		return fmt.Errorf("dedup: batch claim of %d keys answered %d", len(reqs), len(claims))
	}
	c.claims = claims
	if bc, ok := w.store.(deduptype.BatchCompleter); ok && w.cfg.batchWait > 0 {
		c.completer = bc
	}
	return nil
}

// run runs the handlers, each in its own goroutine, and completes their
// successes together: those waiting are written every batch wait (and
// third of a lease) while handlers still run, the rest when the last
// returns.
func (c *concurrentBatch[M]) run(ctx context.Context) {
	var wg sync.WaitGroup
	for i := range c.ds {
		d, p := &c.ds[i], &c.results[i]
		*p = pendingResult{i: i, comp: -1}
		switch k := c.claimOf[i]; {
		case k == laterCopy:
		case k == noClaim:
			wg.Go(func() { p.res, p.err = c.w.process(ctx, d) })
		default:
			wg.Go(func() { c.settle(ctx, i, c.claims[k]) })
		}
	}
	if c.completer == nil {
		wg.Wait()
		return
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	tick := time.NewTicker(min(c.w.cfg.batchWait, c.ds[0].leaseTime/3))
	defer tick.Stop()
	for {
		select {
		case <-done:
			c.complete(ctx)
			return
		case <-tick.C:
			c.complete(ctx)
		}
	}
}

// answerCopies answers each later copy of a key once every first copy is
// settled and completed: from its first copy's outcome, or, when its
// payload differs, from a claim of its own.
func (c *concurrentBatch[M]) answerCopies(ctx context.Context) {
	for i, k := range c.claimOf {
		if k != laterCopy {
			continue
		}
		p := &c.results[i]
		if f := c.first[i]; c.ds[i].fp == c.ds[f].fp {
			*p = pendingResult{i: i, comp: -1, res: copyResult(c.results[f].res), err: c.results[f].err}
		} else {
			p.res, p.err = c.w.process(ctx, &c.ds[i])
		}
	}
}

// settle runs claimed delivery i, leaving a success to be completed with
// others. Its result is set under the lock that complete takes to mark a
// completion failed.
func (c *concurrentBatch[M]) settle(ctx context.Context, i int, claim Claim) {
	var later *[]deduptype.Completion
	var comps []deduptype.Completion
	if c.completer != nil {
		later = &comps
	}
	res, err := c.w.settle(ctx, &c.ds[i], claim, storeAttempt[M]{c.w}, later)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.results[i].res, c.results[i].err = res, err
	if len(comps) > 0 {
		c.comps = append(c.comps, comps...)
		c.compOf = append(c.compOf, i)
	}
}

// complete writes the successes waiting, and turns those whose completion
// failed into errors.
func (c *concurrentBatch[M]) complete(ctx context.Context) {
	c.mu.Lock()
	comps, compOf := c.comps, c.compOf
	c.comps, c.compOf = nil, nil
	c.mu.Unlock()
	if len(comps) == 0 {
		return
	}
	sctx, cancel := settleContext(ctx)
	errs := c.w.completeHeld(sctx, c.completer, comps, c.ds[0].leaseTime)
	cancel()
	for k, i := range compOf {
		if cerr := errs[k]; cerr != nil {
			c.mu.Lock()
			p := &c.results[i]
			p.res.Outcome = 0
			p.err = c.w.settleError("complete", p.res.Key, cerr, true)
			c.mu.Unlock()
		}
	}
}
