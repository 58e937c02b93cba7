package crashtest

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// fatalTB records a Fatalf and ends its goroutine, as testing.T does.
type fatalTB struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.msg = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit()
}

// wait runs WhileMoving in a goroutine of its own and returns its failure
// message, "" when it returned.
func wait(t *testing.T, stall time.Duration, cond func() bool, progress func() int) string {
	tb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		WhileMoving(tb, stall, "the thing", cond, progress, func() string { return "halfway" })
	}()
	<-done
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return tb.msg
}

// A wait that keeps reaching new highs returns once its condition holds,
// however long that takes against its stall.
func TestWhileMovingWaitsWhileProgressing(t *testing.T) {
	n := 0
	msg := wait(t, time.Millisecond, func() bool { return n >= 5 }, func() int { n++; return n })
	if msg != "" {
		t.Errorf("a wait that progressed on every look failed: %s", msg)
	}
}

// A figure that flickers is no progress: the wait fails once it has not
// risen above its best for the stall, naming what it waited for and how far
// it got.
func TestWhileMovingFailsWithoutNewHigh(t *testing.T) {
	n := 0
	msg := wait(t, 300*time.Millisecond, func() bool { return false }, func() int { n++; return n % 2 })
	for _, want := range []string{"no progress for 300ms", "the thing", "halfway"} {
		if !strings.Contains(msg, want) {
			t.Errorf("failure %q does not say %q", msg, want)
		}
	}
}
