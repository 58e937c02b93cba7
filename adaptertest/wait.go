package adaptertest

import (
	"testing"
	"time"
)

// WaitFor polls cond until it holds, and fails t (naming what it waited
// for) unless it does within timeout. A test waits on an effect this way,
// never on a fixed sleep.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
