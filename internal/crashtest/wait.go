package crashtest

import (
	"testing"
	"time"
)

// Stall is how long a campaign's wait may go without progress before it
// fails. A loaded machine (a load average of 20 on two cores was seen)
// makes a campaign slower, not wrong: a wait for a backlog is bounded by
// its progress, never by a fixed time, and a working consumer settles
// something within minutes at any load.
const Stall = 3 * time.Minute

// Await waits for cond, failing t only once progress has not reached a new
// high for Stall. progress must grow as the wait gets somewhere (events
// settled, offsets committed, letters written); only a value above every
// earlier one counts, so a figure that flickers (an approximate queue
// count, a request that failed once) cannot hold a stuck wait open. The
// failure names what it waited for, how long, and how far it got, as
// describe says.
func Await(t testing.TB, what string, cond func() bool, progress func() int, describe func() string) {
	t.Helper()
	WhileMoving(t, Stall, what, cond, progress, describe)
}

// WhileMoving is Await with a stall of its own.
func WhileMoving(t testing.TB, stall time.Duration, what string, cond func() bool, progress func() int, describe func() string) {
	t.Helper()
	began := time.Now()
	best, movedAt := progress(), began
	for !cond() {
		now := time.Now()
		if n := progress(); n > best {
			best, movedAt = n, now
		} else if now.Sub(movedAt) > stall {
			t.Fatalf("no progress for %v (%v in all) waiting for %s: got as far as %s",
				stall, now.Sub(began).Round(time.Second), what, describe())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
