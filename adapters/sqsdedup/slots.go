package sqsdedup

import (
	"context"
	"sync"
)

// slots counts the free worker slots, one per message held. Slots given
// back together are taken together, so that a poller waiting for them
// receives as many messages as a finished receive freed, not the first one.
type slots struct {
	mu   sync.Mutex
	free int
	wake chan struct{} // a token when slots may be free
}

func newSlots(n int) *slots { return &slots{free: n, wake: make(chan struct{}, 1)} }

// take waits for a free slot and takes up to max, or returns 0 once ctx is
// done (a free slot does not win a tie with ctx).
func (s *slots) take(ctx context.Context, max int) int {
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

// give gives n slots back.
func (s *slots) give(n int) {
	if n == 0 {
		return
	}
	s.mu.Lock()
	s.free += n
	s.mu.Unlock()
	s.signal()
}

func (s *slots) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// tryTake takes up to max free slots without waiting.
func (s *slots) tryTake(max int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := min(s.free, max)
	s.free -= n
	return n
}
