package redisstore

import (
	"context"
	"fmt"
	"slices"
	"sync"
)

// coalescer runs the single calls of concurrent callers together, as
// group commit does: a caller who finds fewer than max calls in flight runs
// its own at once; callers arriving while max are in flight wait in a
// queue, and when a call ends, the first of them runs the whole queue as
// one call. Under load, many claims (or completions) then share one script
// call and one round trip, which costs the single-threaded server and the
// client a fraction of one call each; a caller alone waits for nothing. It
// runs no goroutine of its own: each batch runs on one of its callers'.
type coalescer[Req, Res any] struct {
	max int // calls in flight at once
	// run answers reqs in order, one result or error each. It is given a
	// context no single caller can cancel: the batch is everyone's.
	run func(ctx context.Context, reqs []Req) ([]Res, []error)

	mu      sync.Mutex
	flights int
	queue   []*waiter[Req, Res]
}

// waiter is one caller's request, and then its answer.
type waiter[Req, Res any] struct {
	req Req
	res Res
	err error
	// lead is set, before done is signalled, when this waiter must run
	// the batch it holds (itself first) rather than read an answer.
	lead []*waiter[Req, Res]
	done chan struct{}
}

// do answers req, alone or in a batch with other callers' requests. A
// caller whose context ends while it waits in the queue leaves it with the
// context's error; once its batch has started, it waits for the answer,
// which is bounded by the client's own timeouts, since the request may have
// taken effect.
func (c *coalescer[Req, Res]) do(ctx context.Context, req Req) (Res, error) {
	w := &waiter[Req, Res]{req: req}
	c.mu.Lock()
	if c.flights < c.max {
		c.flights++
		c.mu.Unlock()
		c.runBatch(ctx, []*waiter[Req, Res]{w})
		return w.res, w.err
	}
	w.done = make(chan struct{}, 1)
	c.queue = append(c.queue, w)
	c.mu.Unlock()
	select {
	case <-w.done:
	case <-ctx.Done():
		c.mu.Lock()
		if i := slices.Index(c.queue, w); i >= 0 {
			c.queue = slices.Delete(c.queue, i, i+1)
			c.mu.Unlock()
			var zero Res
			return zero, ctx.Err()
		}
		c.mu.Unlock()
		<-w.done // taken into a batch already
	}
	if w.lead != nil {
		c.runBatch(ctx, w.lead)
	}
	return w.res, w.err
}

// runBatch runs batch as one call, answers its waiters, and hands the
// flight on to the queue, or ends it. If run panics, the other waiters are
// answered with an error and the flight is handed on before the panic goes
// on up the caller's stack: a panic must not leave callers waiting forever.
func (c *coalescer[Req, Res]) runBatch(ctx context.Context, batch []*waiter[Req, Res]) {
	reqs := make([]Req, len(batch))
	for i, w := range batch {
		reqs[i] = w.req
	}
	answered := false
	defer func() {
		if answered {
			return
		}
		v := recover()
		for _, w := range batch[1:] {
			w.err = fmt.Errorf("redisstore: the call this one shared panicked: %v", v)
			w.done <- struct{}{}
		}
		c.handOn()
		if v != nil { // nil: the goroutine is exiting (runtime.Goexit), not panicking
			panic(v)
		}
	}()
	res, errs := c.run(context.WithoutCancel(ctx), reqs)
	answered = true
	for i, w := range batch {
		w.res, w.err = res[i], errs[i]
		if w.done != nil && i > 0 {
			w.done <- struct{}{}
		}
	}
	c.handOn()
}

// handOn gives the flight that ended to the queue's first waiter, with the
// queue as its batch, or ends it when nobody waits.
func (c *coalescer[Req, Res]) handOn() {
	c.mu.Lock()
	if len(c.queue) == 0 {
		c.flights--
		c.mu.Unlock()
		return
	}
	next := c.queue
	c.queue = nil
	next[0].lead = next
	c.mu.Unlock()
	next[0].done <- struct{}{}
}
