package adaptertest

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Goroutines is a record of the goroutines running at one moment, against
// which [Goroutines.AssertNoneNew] finds the ones started since that have
// not ended.
type Goroutines struct {
	current goleak.Option
	ignore  []goleak.Option
}

// SnapshotGoroutines records the goroutines running now; goroutines with
// one of the functions ignore on their stack will never count as new.
func SnapshotGoroutines(ignore ...string) *Goroutines {
	g := &Goroutines{current: goleak.IgnoreCurrent()}
	for _, f := range ignore {
		g.ignore = append(g.ignore, goleak.IgnoreAnyFunction(f))
	}
	return g
}

// AssertNoneNew fails t if, until timeout passes, goroutines started since
// the snapshot are still running: a goroutine that ends late (a connection
// closed on the server's side) is waited for, one that never ends fails.
func (g *Goroutines) AssertNoneNew(t testing.TB, timeout time.Duration) {
	t.Helper()
	opts := append([]goleak.Option{g.current}, g.ignore...)
	deadline := time.Now().Add(timeout)
	for {
		err := goleak.Find(opts...)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("goroutines left running %v after Run returned: %v", timeout, err)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}
