package natsdedup

import (
	"context"
	"sync"
)

// slots counts the free workers, one per message held.
type slots struct {
	mu   sync.Mutex
	free int
	wake chan struct{} // a token when slots may have been given back
}

func newSlots(n int) *slots { return &slots{free: n, wake: make(chan struct{}, 1)} }

// take waits for a free slot and takes up to max, or returns 0 once ctx is
// done.
func (s *slots) take(ctx context.Context, max int) int {
	for ctx.Err() == nil {
		s.mu.Lock()
		n := min(s.free, max)
		s.free -= n
		s.mu.Unlock()
		if n > 0 {
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
	if n <= 0 {
		return
	}
	s.mu.Lock()
	s.free += n
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}
