package adaptertest

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/dedupkit/dedup"
)

// shutdownMargin is what Run may take beyond the shutdown timeout to
// return: the adapter's own last calls (a commit, a group leave, a long
// poll's end), on a loaded machine.
const shutdownMargin = 20 * ShutdownTimeout

// Canceling Run's context while handlers run returns within the shutdown
// timeout (and a margin) and leaves no goroutine running; a second consumer
// then applies every event exactly once: nothing the first one held is
// lost, nothing it applied runs again.
func testShutdown(t *testing.T, f Features, h Harness) {
	const events, done = 20, 5 // done: how many the first consumer applies
	msgs, ids := messages("stop", events)
	h.Publish(t, msgs...)
	store, scope, fx := dedup.NewMemoryStore(), newScope(t), NewEffects()

	// The first consumer's handler applies the first events it gets, then
	// holds every later one until its context is canceled.
	var calls, held atomic.Int32
	first := h.NewConsumer(t, config(t, store, scope, fx, func(ctx context.Context, m Message) error {
		fx.Call(m.ID)
		if calls.Add(1) <= done {
			fx.Apply(m.ID)
			return nil
		}
		held.Add(1)
		<-ctx.Done()
		return ctx.Err()
	}))
	goroutines := SnapshotGoroutines(f.IgnoreGoroutines...)
	run := Start(t, first.Run)
	WaitFor(t, Deadline, "events applied and a handler held", func() bool {
		return fx.Applied() >= done && held.Load() > 0
	})
	if err := run.Stop(t); err != nil {
		t.Errorf("Run: %v, want nil after its context was canceled", err)
	}
	if took := run.Took(); took > ShutdownTimeout+shutdownMargin {
		t.Errorf("Run took %v to return, want the shutdown timeout (%v) and at most %v more", took, ShutdownTimeout, shutdownMargin)
	}
	goroutines.AssertNoneNew(t, Deadline)
	t.Logf("the first consumer applied %d events and held %d when stopped", fx.Applied(), held.Load())

	second := Start(t, h.NewConsumer(t, config(t, store, scope, fx, applying(fx, 0))).Run)
	WaitFor(t, Deadline, "every event applied", func() bool { return fx.Applied() == events })
	second.StopClean(t)
	waitSettled(t, h)
	fx.AssertOnce(t, ids)
	assertRecords(t, store, scope, ids, dedup.StatusSucceeded)
}
