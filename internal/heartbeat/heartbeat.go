// Package heartbeat keeps the messages a transport adapter holds from being
// delivered to another consumer while they are handled: SQS's visibility
// extended, JetStream's AckWait restarted.
package heartbeat

import (
	"context"
	"sync"
	"time"
)

// Held is the set of messages an adapter holds, each kept alive by a beat
// every period until it is removed (settled, given back, or delayed for a
// retry). It is safe for concurrent use.
type Held[M any] struct {
	every time.Duration
	key   func(M) string
	beat  func(context.Context, []M)

	mu   sync.Mutex
	held map[string]M
	// beating is held through a beat, so that Remove waits for a beat in
	// progress: a removed message is never kept alive again, which could
	// undo a delay set on it afterwards.
	beating sync.Mutex
}

// New returns a Held whose Run calls beat with every held message every
// period; key identifies a delivery (a receipt handle, a reply subject).
func New[M any](every time.Duration, key func(M) string, beat func(context.Context, []M)) *Held[M] {
	return &Held[M]{every: every, key: key, beat: beat, held: make(map[string]M)}
}

// Add holds msgs.
func (h *Held[M]) Add(msgs ...M) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range msgs {
		h.held[h.key(m)] = m
	}
}

// Remove stops holding msgs, once a beat in progress is over.
func (h *Held[M]) Remove(msgs ...M) {
	h.beating.Lock()
	defer h.beating.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range msgs {
		delete(h.held, h.key(m))
	}
}

// Run beats every period until ctx is done.
func (h *Held[M]) Run(ctx context.Context) {
	t := time.NewTicker(h.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			h.beatOnce(ctx)
		}
	}
}

func (h *Held[M]) beatOnce(ctx context.Context) {
	h.beating.Lock()
	defer h.beating.Unlock()
	h.mu.Lock()
	msgs := make([]M, 0, len(h.held))
	for _, m := range h.held {
		msgs = append(msgs, m)
	}
	h.mu.Unlock()
	if len(msgs) > 0 {
		h.beat(ctx, msgs)
	}
}
