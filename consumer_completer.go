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
// [BatchCompleter]) queues them, and the batch writes them together in one
// call once they are due or it needs them.
type completer[M any] interface {
	// attempt returns the attempt that settles delivery i's store claim.
	attempt(i int) attempt[M]
	// due reports whether the successes queued must be written now: the
	// wait of the first is up, or nothing waits (inline).
	due() bool
	// period is how often a batch whose handlers run at once writes the
	// successes queued meanwhile, given its lease; 0: nothing is queued.
	period(lease time.Duration) time.Duration
	// flush writes the successes queued, recording the error of each at
	// its delivery in errs.
	flush(ctx context.Context, errs []error)
}

// inlineCompleter completes each success in a write of its own, as its
// attempt settles.
type inlineCompleter[M any] struct{ w *Wrapper[M] }

func newInlineCompleter[M any](b *batch[M]) completer[M] { return inlineCompleter[M]{b.w} }

func (c inlineCompleter[M]) attempt(int) attempt[M]           { return storeAttempt[M](c) }
func (inlineCompleter[M]) due() bool                          { return true }
func (inlineCompleter[M]) period(time.Duration) time.Duration { return 0 }
func (inlineCompleter[M]) flush(context.Context, []error)     {}

// batchedCompleter queues a batch's successes, to be completed together in
// one call of the store's BatchCompleter. It is kept with its batch for
// reuse; queuing is safe for concurrent use, flushing is the batch's loop's.
type batchedCompleter[M any] struct {
	w     *Wrapper[M]
	atts  []queuedAttempt[M] // by delivery: handed out as pointers, which allocates nothing
	mu    sync.Mutex
	queue []deduptype.Completion
	of    []int     // the delivery of each queued completion
	dueBy time.Time // when the first queued must be written, at the latest
	lease time.Duration
	// spare are the slices of the last flush, for the next queue.
	spare   []deduptype.Completion
	spareOf []int
}

func newBatchedCompleter[M any](b *batch[M]) completer[M] {
	c := &b.queue
	c.w, c.atts = b.w, grow(c.atts, len(b.outcomes))
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
	return len(c.queue) > 0 && !time.Now().Before(c.dueBy)
}

func (c *batchedCompleter[M]) period(lease time.Duration) time.Duration {
	return min(c.w.cfg.batchWait, lease/3)
}

// add queues the success of delivery i, whose claim d holds.
func (c *batchedCompleter[M]) add(i int, d *delivery[M]) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		c.lease, c.dueBy = d.leaseTime, time.Now().Add(c.period(d.leaseTime))
	}
	c.queue = append(c.queue, deduptype.Completion{Key: d.key, Owner: d.owner, TTL: c.w.cfg.ttl, Locator: d.locator})
	c.of = append(c.of, i)
}

func (c *batchedCompleter[M]) flush(ctx context.Context, errs []error) {
	c.mu.Lock()
	queue, of, lease := c.queue, c.of, c.lease
	c.queue, c.of = c.spare[:0], c.spareOf[:0]
	c.mu.Unlock()
	if len(queue) > 0 {
		for k, cerr := range c.w.completeHeld(ctx, c.w.bc, queue, lease) {
			errs[of[k]] = cerr
		}
	}
	c.spare, c.spareOf = queue, of
}

// reset lets go of what the completer's slices reach, for its batch to be
// kept.
func (c *batchedCompleter[M]) reset() {
	clear(c.atts[:cap(c.atts)])
	clear(c.queue[:cap(c.queue)])
	clear(c.spare[:cap(c.spare)])
	c.queue, c.of, c.w = c.queue[:0], c.of[:0], nil
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
			cerr := res[k]
			if retried && errors.Is(cerr, ErrLeaseLost) && landed(ctx, w.store, comps[i].Key, comps[i].Owner) {
				cerr = nil
			}
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
