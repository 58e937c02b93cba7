// Package shutdown is the transport adapters' wait for running handlers
// when a consumer stops.
package shutdown

import (
	"sync"
	"time"
)

// Grace bounds how long a consumer still waits for handlers once it has
// cancelled their contexts: time for the wrapper to record the attempt.
const Grace = 15 * time.Second

// Wait waits for handlers to finish. After timeout it calls cancel (the
// handlers' contexts) and onCancel, and waits up to Grace more; it returns
// false if they were still running then.
func Wait(handlers *sync.WaitGroup, timeout time.Duration, cancel, onCancel func()) bool {
	done := make(chan struct{})
	go func() {
		handlers.Wait()
		close(done)
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
	}
	onCancel()
	cancel()
	t.Reset(Grace)
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}
