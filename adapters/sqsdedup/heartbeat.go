package sqsdedup

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// heartbeat keeps the messages a consumer holds invisible: every third of
// the visibility timeout it extends them all to a full timeout, until each
// is removed (deleted, given back, or delayed for a retry).
type heartbeat struct {
	r    *runner
	mu   sync.Mutex
	held map[string]types.Message // by receipt handle
	// beating is held through a beat's calls, so that remove waits for a beat
	// in progress: a removed message is never extended again, and a delay
	// set on it afterwards stands.
	beating sync.Mutex
}

func newHeartbeat(r *runner) *heartbeat {
	return &heartbeat{r: r, held: make(map[string]types.Message)}
}

func (h *heartbeat) add(msgs ...types.Message) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range msgs {
		h.held[aws.ToString(m.ReceiptHandle)] = m
	}
}

func (h *heartbeat) remove(msgs ...types.Message) {
	h.beating.Lock()
	defer h.beating.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range msgs {
		delete(h.held, aws.ToString(m.ReceiptHandle))
	}
}

func (h *heartbeat) run(ctx context.Context) {
	t := time.NewTicker(h.r.vis / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			h.beat(ctx)
		}
	}
}

func (h *heartbeat) beat(ctx context.Context) {
	h.beating.Lock()
	defer h.beating.Unlock()
	h.mu.Lock()
	msgs := make([]types.Message, 0, len(h.held))
	for _, m := range h.held {
		msgs = append(msgs, m)
	}
	h.mu.Unlock()
	// One attempt per beat: a failed entry is retried by the next beat, two
	// more of which come before the timeout runs out.
	for _, batch := range chunks(msgs) {
		if lost := h.r.retryBatch(ctx, "visibility heartbeat", batch, 1, h.r.visibilityCall(h.r.vis)); len(lost) > 0 {
			h.r.log.Warn("sqsdedup: visibility not extended; these messages may be delivered again while held",
				slog.Int("messages", len(lost)))
		}
	}
}
