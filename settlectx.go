package dedup

import (
	"context"
	"sync"
	"time"
)

// boundedContext is the context of a write that outlives its caller: the
// values of its parent without the parent's cancellation, done at its
// deadline or when released. Its channel and timer are made only when Done
// is first called, so that a write to a store that never waits on its
// context (the memory store) costs one allocation instead of a timer and
// two contexts.
type boundedContext struct {
	context.Context // the parent's values, without its cancellation (context.WithoutCancel)

	deadline time.Time

	mu    sync.Mutex
	done  chan struct{} // made by the first Done
	timer *time.Timer   // closes done at the deadline
	err   error         // context.DeadlineExceeded or context.Canceled once done
}

// withBound returns ctx's values without its cancellation, done once bound
// has passed or its release is called.
func withBound(ctx context.Context, bound time.Duration) *boundedContext {
	return new(boundedContext).bind(ctx, bound)
}

// bind makes c, unused until now, what withBound returns: a caller that
// holds a boundedContext in a struct of its own saves its allocation.
func (c *boundedContext) bind(ctx context.Context, bound time.Duration) *boundedContext {
	c.Context, c.deadline = context.WithoutCancel(ctx), time.Now().Add(bound)
	return c
}

func (c *boundedContext) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *boundedContext) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		switch d := time.Until(c.deadline); {
		case c.err != nil:
			close(c.done)
		case d <= 0:
			c.end(context.DeadlineExceeded)
		default:
			c.timer = time.AfterFunc(d, c.expire)
		}
	}
	return c.done
}

func (c *boundedContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil && !time.Now().Before(c.deadline) {
		c.end(context.DeadlineExceeded)
	}
	return c.err
}

func (c *boundedContext) expire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.end(context.DeadlineExceeded)
}

// release ends c, as a CancelFunc does: what waits on it stops.
func (c *boundedContext) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.end(context.Canceled)
}

// end records err as why c ended, once, and closes its channel if made.
func (c *boundedContext) end(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.done != nil {
		close(c.done)
	}
}

func (c *boundedContext) String() string { return "dedup.settleContext" }
