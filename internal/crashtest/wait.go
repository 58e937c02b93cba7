package crashtest

import (
	"testing"
	"time"
)

// WhileMoving waits for cond, failing only once n has not changed for
// stall: a loaded machine makes a campaign slower, not wrong, so a wait is
// bounded by its progress rather than by a fixed time.
func WhileMoving(t *testing.T, stall time.Duration, cond func() bool, n func() int, what string, progress func() string) {
	t.Helper()
	last, lastAt := n(), time.Now()
	for !cond() {
		if now := n(); now != last {
			last, lastAt = now, time.Now()
		}
		if time.Since(lastAt) > stall {
			t.Fatalf("no progress for %v: %s (%s)", stall, what, progress())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
