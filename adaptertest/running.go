package adaptertest

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Running is a consumer's Run in progress, started by [Start].
type Running struct {
	cancel  context.CancelFunc
	done    chan error
	stopped chan struct{}
	once    sync.Once
	err     error
	took    time.Duration
	within  time.Duration
}

// Start runs run (a consumer's Run) on a context of its own until Stop or
// the end of the test.
func Start(t testing.TB, run func(context.Context) error) *Running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{cancel: cancel, done: make(chan error, 1), stopped: make(chan struct{}), within: Deadline}
	go func() { r.done <- run(ctx) }()
	t.Cleanup(func() { r.Stop(t) })
	return r
}

// Within sets how long Stop waits for Run to return (default [Deadline]):
// longer for a consumer whose handlers may run on for long after Run's
// context is done.
func (r *Running) Within(d time.Duration) { r.within = d }

// Stop cancels Run's context and returns what Run returned, failing t if
// it did not return in time (see Within). It may be called again, and
// returns the same.
func (r *Running) Stop(t testing.TB) error {
	t.Helper()
	r.once.Do(func() {
		began := time.Now()
		r.cancel()
		select {
		case r.err = <-r.done:
			r.took = time.Since(began)
			close(r.stopped)
		case <-time.After(r.within):
			t.Fatalf("Run did not return within %v of its context's cancellation", r.within)
		}
	})
	return r.err
}

// StopClean is Stop that also fails t unless Run returned nil.
func (r *Running) StopClean(t testing.TB) {
	t.Helper()
	if err := r.Stop(t); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// Took returns how long Run took to return once Stop canceled it; zero
// before it returned.
func (r *Running) Took() time.Duration {
	select {
	case <-r.stopped:
		return r.took
	default:
		return 0
	}
}
