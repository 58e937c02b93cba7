package dedup

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dedupkit/dedup/deduptype"
)

// completer completes the successes of a batch's store claims, behind one
// call: the complete of the attempt it gives each claim. Which kind a batch
// gets is chosen once, when the wrapper is built (Wrap; river's JobCompleter
// is the model): inlineCompleter writes each success as its attempt
// settles; batchedCompleter ([WithBatchCompletion], on a store that is a
// [BatchCompleter]) queues them and writes them together in one call, when
// its timer fires (within the wait, and a third of the lease of the first
// queued) or when the batch needs them sooner. When the completions are
// written is the completer's alone, whichever loop settles the batch.
type completer[M any] interface {
	// attempt returns the attempt that settles delivery i's store claim.
	attempt(i int) attempt[M]
	// due reports whether the batch may give its results now: nothing it
	// queued waits, or the wait of the first is up.
	due() bool
	// flush writes the successes queued, once any write under way ended.
	flush(ctx context.Context)
	// err returns the error of delivery i's completion, written by a
	// flush or the timer.
	err(i int) error
	// stop ends the completer's timer, once any write under way ended.
	stop()
}

// inlineCompleter completes each success in a write of its own, as its
// attempt settles.
type inlineCompleter[M any] struct{ w *Wrapper[M] }

func newInlineCompleter[M any](b *batch[M]) completer[M] { return inlineCompleter[M]{b.w} }

func (c inlineCompleter[M]) attempt(int) attempt[M] { return storeAttempt[M](c) }
func (inlineCompleter[M]) due() bool                { return true }
func (inlineCompleter[M]) flush(context.Context)    {}
func (inlineCompleter[M]) err(int) error            { return nil }
func (inlineCompleter[M]) stop()                    {}

// batchedCompleter queues a batch's successes, to be completed together in
// one call of the store's BatchCompleter. It is kept with its batch for
// reuse. Queuing is safe for concurrent use; the writes, the timer's and
// the batch's loop's, follow one another.
type batchedCompleter[M any] struct {
	w    *Wrapper[M]
	atts []queuedAttempt[M] // by delivery: handed out as pointers, which allocates nothing
	// writing is held for the whole of a write, so that a flush returns
	// only once what was queued before it is written.
	writing sync.Mutex
	// timer writes the queue when its first completion's wait is up; it
	// is started when the queue's first completion is queued.
	timer *time.Timer
	mu    sync.Mutex // guards what follows
	ctx   context.Context
	queue []deduptype.Completion
	of    []int     // the delivery of each queued completion
	dueBy time.Time // when the first queued must be written, at the latest
	lease time.Duration
	errs  []error // by delivery, the error of its completion
	// spare are the slices of the last write, for the next queue.
	spare   []deduptype.Completion
	spareOf []int
}

func newBatchedCompleter[M any](b *batch[M]) completer[M] {
	c := &b.queue
	c.mu.Lock()
	defer c.mu.Unlock()
	c.w, c.ctx = b.w, b.ctx
	c.atts, c.errs = grow(c.atts, len(b.ds)), grow(c.errs, len(b.ds))
	return c
}

func (c *batchedCompleter[M]) attempt(i int) attempt[M] {
	a := &c.atts[i]
	*a = queuedAttempt[M]{storeAttempt: storeAttempt[M]{c.w}, c: c, i: i}
	return a
}

func (c *batchedCompleter[M]) due() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue) == 0 || !time.Now().Before(c.dueBy)
}

// period is how long the first of the queue waits to be written, given its
// lease: the wait, and at most a third of the lease, so that a completion
// is written while its lease holds.
func (c *batchedCompleter[M]) period(lease time.Duration) time.Duration {
	return min(c.w.cfg.batchWait, lease/3)
}

// add queues the success of delivery i, whose claim d holds; the first of
// the queue starts the timer.
func (c *batchedCompleter[M]) add(i int, d *delivery[M]) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		wait := c.period(d.leaseTime)
		c.lease, c.dueBy = d.leaseTime, time.Now().Add(wait)
		if c.timer == nil {
			c.timer = time.AfterFunc(wait, c.fire)
		} else {
			c.timer.Reset(wait)
		}
	}
	c.queue = append(c.queue, deduptype.Completion{Key: d.key, Owner: d.owner, TTL: c.w.cfg.ttl, Locator: d.locator})
	c.of = append(c.of, i)
}

// fire is the timer's: it writes the queue, on the batch's context.
func (c *batchedCompleter[M]) fire() {
	c.mu.Lock()
	ctx := c.ctx
	c.mu.Unlock()
	if ctx != nil {
		c.flush(ctx)
	}
}

func (c *batchedCompleter[M]) flush(ctx context.Context) {
	c.writing.Lock()
	defer c.writing.Unlock()
	c.mu.Lock()
	w, queue, of, lease := c.w, c.queue, c.of, c.lease
	if len(queue) == 0 {
		c.mu.Unlock()
		return
	}
	c.queue, c.of = c.spare[:0], c.spareOf[:0]
	c.mu.Unlock()
	sctx, cancel := w.settleCtx(ctx, settleTimeout)
	if sctx == ctx {
		sctx, cancel = outliving(ctx, settleTimeout)
	}
	errs := w.completeHeld(sctx, w.bc, queue, lease)
	cancel()
	c.mu.Lock()
	for k, cerr := range errs {
		c.errs[of[k]] = cerr
	}
	c.spare, c.spareOf = queue, of
	c.mu.Unlock()
}

// outliving returns a context that is ctx until ctx is done, and lives
// bound longer: a write of successes under way when the batch is cancelled
// (a shutdown, a revoked partition) still lands, instead of leaving effects
// that ran unrecorded. It is fenced on the owners, so it touches no claim
// somebody else took over.
func outliving(ctx context.Context, bound time.Duration) (context.Context, context.CancelFunc) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(bound, cancel) })
	return sctx, func() {
		stop()
		cancel()
	}
}

func (c *batchedCompleter[M]) err(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.errs[i]
}

func (c *batchedCompleter[M]) stop() {
	c.writing.Lock()
	defer c.writing.Unlock()
	if c.timer != nil {
		c.timer.Stop()
	}
}

// reset lets go of what the completer's slices reach, for its batch to be
// kept. A timer that fired late finds nothing to write.
func (c *batchedCompleter[M]) reset() {
	c.writing.Lock()
	defer c.writing.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.atts[:cap(c.atts)])
	clear(c.queue[:cap(c.queue)])
	clear(c.spare[:cap(c.spare)])
	clear(c.errs[:cap(c.errs)])
	c.queue, c.of, c.w, c.ctx = c.queue[:0], c.of[:0], nil, nil
}

// queuedAttempt is a store claim of a batch whose success is queued in its
// batch's completer rather than written on its own.
type queuedAttempt[M any] struct {
	storeAttempt[M]
	c *batchedCompleter[M]
	i int // the delivery's index in the batch
}

func (a *queuedAttempt[M]) complete(_ context.Context, d *delivery[M], _ bool) error {
	a.c.add(a.i, d)
	return nil
}

// completeHeld writes comps with bc, trying again as a single completion is
// (see outcomeLeases): the handlers ran, and giving up would run them
// again once the leases lapsed. A store may answer some completions with an
// error of their own (a request of its batch failed): those are tried
// again, the others are done. A completion refused after an earlier try
// whose answer was lost counts as done when it landed. It returns one error
// per completion.
func (w *Wrapper[M]) completeHeld(ctx context.Context, bc deduptype.BatchCompleter, comps []deduptype.Completion, lease time.Duration) []error {
	errs := make([]error, len(comps))
	pending := make([]int, len(comps))
	for i := range pending {
		pending[i] = i
	}
	batch := comps
	err := w.retryHeld(ctx, outcomeLeases*lease, func(ctx context.Context, retried bool) error {
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
			cerr := forgiveLanded(ctx, w.store, comps[i].Key, comps[i].Owner, retried, res[k])
			errs[i] = cerr
			if cerr != nil && !errors.Is(cerr, ErrLeaseLost) && !isUnrepeatable(cerr) {
				again, retry = append(again, i), cerr
			}
		}
		pending, batch = again, make([]deduptype.Completion, len(again))
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
