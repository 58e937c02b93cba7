package dedup

import (
	"sync"
	"time"
)

// heartbeat is the state of one attempt's lease extensions.
type heartbeat struct {
	interval time.Duration
	mu       sync.Mutex
	timer    *time.Timer
	stopped  bool
	done     sync.WaitGroup
}

// begin reports whether an extension may run, and counts it as running.
func (h *heartbeat) begin() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return false
	}
	h.done.Add(1)
	return true
}

func (h *heartbeat) rearm() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.stopped {
		h.timer.Reset(h.interval)
	}
}

func (h *heartbeat) stop() {
	h.mu.Lock()
	h.stopped = true
	h.timer.Stop()
	h.mu.Unlock()
	h.done.Wait()
}
