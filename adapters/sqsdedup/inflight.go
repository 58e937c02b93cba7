package sqsdedup

import (
	"context"
	"sync"
	"time"
)

// batches tracks the batches of a standard queue being handled, so that a
// message answered OutcomeInFlight can wait for the others to settle. With
// more workers than one batch holds, two batches in progress can carry
// copies of one event, and the later finds the event in flight in this very
// consumer. Given back to SQS, that copy would stay invisible for at least a
// second (SQS's visibility timeouts are whole seconds) and cost a receive
// and a claim more; looked at again once the first batch is settled, it is
// answered as a duplicate at once.
type batches struct {
	mu      sync.Mutex
	running map[*batch]struct{}
	started uint64 // batches started so far
}

// batch is one batch being handled; done is closed when its handling (claim,
// handlers, completion) has ended.
type batch struct {
	done chan struct{}
	// alone is whether no other batch was being handled when this one
	// started, and started the count of batches started by then.
	alone   bool
	started uint64
}

func newBatches() *batches { return &batches{running: make(map[*batch]struct{})} }

// start registers a batch whose handling begins.
func (bs *batches) start() *batch {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	bs.started++
	b := &batch{done: make(chan struct{}), alone: len(bs.running) == 0, started: bs.started}
	bs.running[b] = struct{}{}
	return b
}

// end marks b's handling as ended; it may be called more than once.
func (bs *batches) end(b *batch) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if _, ok := bs.running[b]; ok {
		delete(bs.running, b)
		close(b.done)
	}
}

// shared reports whether another batch was being handled at some time since
// b started: only then can this consumer hold an event b finds in flight.
func (bs *batches) shared(b *batch) bool {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	return !b.alone || bs.started != b.started || len(bs.running) > 1
}

// waitOthers ends b's handling and waits until the other batches being
// handled have ended, for at most d or until stop is done. A batch waits
// only for batches still in their handling, which wait for none, so no two
// wait for each other.
func (bs *batches) waitOthers(stop context.Context, b *batch, d time.Duration) {
	bs.end(b)
	bs.mu.Lock()
	var others []chan struct{}
	for o := range bs.running {
		others = append(others, o.done)
	}
	bs.mu.Unlock()
	if len(others) == 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for _, done := range others {
		select {
		case <-done:
		case <-t.C:
			return
		case <-stop.Done():
			return
		}
	}
}
