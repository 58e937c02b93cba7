package deduptest

import (
	"context"
	"sync/atomic"

	"github.com/dedupkit/dedup"
)

// FailingSink is a [dedup.MemorySink] whose Send can be made to fail, as a
// dead-letter topic or queue that is down.
type FailingSink struct {
	*dedup.MemorySink
	failing atomic.Pointer[error]
}

// NewFailingSink returns a FailingSink that takes letters until FailWith.
func NewFailingSink() *FailingSink { return &FailingSink{MemorySink: dedup.NewMemorySink()} }

// FailWith makes every later Send return err until called with nil.
func (s *FailingSink) FailWith(err error) {
	if err == nil {
		s.failing.Store(nil)
		return
	}
	s.failing.Store(&err)
}

// Send returns the error set by FailWith, or keeps dl.
func (s *FailingSink) Send(ctx context.Context, dl dedup.DeadLetter) error {
	if err := s.failing.Load(); err != nil {
		return *err
	}
	return s.MemorySink.Send(ctx, dl)
}
