// Package slots counts a consumer's free workers, one per message held, for
// the transport adapters that pull messages (sqsdedup, natsdedup): a pull
// asks for no more messages than there are workers free to handle them.
package slots

import (
	"context"
	"sync"
)

// Slots counts the free worker slots, one per message held. Slots given
// back together are taken together, so that a poller waiting for them
// receives as many messages as a finished receive freed, not the first one.
type Slots struct {
	mu   sync.Mutex
	free int
	wake chan struct{} // a token when slots may be free
}

// New returns Slots with n free.
func New(n int) *Slots { return &Slots{free: n, wake: make(chan struct{}, 1)} }

// Take waits for a free slot and takes up to max, or returns 0 once ctx is
// done (a free slot does not win a tie with ctx).
func (s *Slots) Take(ctx context.Context, max int) int {
	for ctx.Err() == nil {
		s.mu.Lock()
		n := min(s.free, max)
		s.free -= n
		left := s.free
		s.mu.Unlock()
		if n > 0 {
			if left > 0 {
				s.signal() // for another poller
			}
			return n
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
		}
	}
	return 0
}

// Give gives n slots back.
func (s *Slots) Give(n int) {
	if n == 0 {
		return
	}
	s.mu.Lock()
	s.free += n
	s.mu.Unlock()
	s.signal()
}

func (s *Slots) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// TryTake takes up to max free slots without waiting.
func (s *Slots) TryTake(max int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := min(s.free, max)
	s.free -= n
	return n
}
