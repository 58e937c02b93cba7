// Package shutdown is the transport adapters' wait for running handlers
// when a consumer stops.
package shutdown

import (
	"errors"
	"log/slog"
	"sync"
	"time"
)

// Grace bounds how long a consumer still waits for handlers once it has
// cancelled their contexts: time for the wrapper to record the attempt.
const Grace = 15 * time.Second

// Wait waits for handlers to finish. After timeout it logs so at WARN and
// calls cancel (the handlers' contexts), then waits up to Grace more, and
// returns an error if they are still running; name (such as
// "sqsdedup: <queue URL>") begins the messages.
func Wait(handlers *sync.WaitGroup, timeout time.Duration, cancel func(), log *slog.Logger, name string) error {
	done := make(chan struct{})
	go func() {
		handlers.Wait()
		close(done)
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
	}
	log.Warn(name + ": handlers still running after the shutdown timeout; cancelling them")
	cancel()
	t.Reset(Grace)
	select {
	case <-done:
		return nil
	case <-t.C:
		return errors.New(name + ": handlers still running after their contexts were cancelled")
	}
}
