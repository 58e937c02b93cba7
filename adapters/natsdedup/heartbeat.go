package natsdedup

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// heartbeat keeps the messages a consumer holds from being delivered again:
// every third of the AckWait it sends InProgress for each, which restarts
// the server's AckWait timer, until each is removed (acknowledged, naked or
// terminated).
type heartbeat struct {
	every time.Duration
	log   *slog.Logger
	mu    sync.Mutex
	held  map[string]jetstream.Msg // by reply subject, one per delivery
	// beating is held through a beat, so that remove waits for a beat in
	// progress: a removed message is never marked in progress again, which
	// could undo the delay of a nak sent after it.
	beating sync.Mutex
}

func (h *heartbeat) add(msgs ...jetstream.Msg) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range msgs {
		h.held[m.Reply()] = m
	}
}

func (h *heartbeat) remove(msgs ...jetstream.Msg) {
	h.beating.Lock()
	defer h.beating.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range msgs {
		delete(h.held, m.Reply())
	}
}

func (h *heartbeat) run(ctx context.Context) {
	t := time.NewTicker(h.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			h.beat()
		}
	}
}

func (h *heartbeat) beat() {
	h.beating.Lock()
	defer h.beating.Unlock()
	h.mu.Lock()
	msgs := make([]jetstream.Msg, 0, len(h.held))
	for _, m := range h.held {
		msgs = append(msgs, m)
	}
	h.mu.Unlock()
	// InProgress is a publish: it fails only when the connection cannot take
	// it (closed, or its reconnect buffer full). The next beat tries again,
	// two of which come before the AckWait runs out.
	failed, last := 0, error(nil)
	for _, m := range msgs {
		if err := m.InProgress(); err != nil {
			failed, last = failed+1, err
		}
	}
	if failed > 0 {
		h.log.Warn("natsdedup: heartbeat not sent; these messages may be delivered again while held",
			slog.Int("messages", failed), slog.Any("error", last))
	}
}
