package natsdedup

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup/internal/heartbeat"
)

// newHeartbeat returns what keeps the messages a consumer holds from being
// delivered again: every every it sends InProgress for each, which restarts
// the server's AckWait timer, until each is removed (acknowledged, naked or
// terminated).
func newHeartbeat(every time.Duration, log *slog.Logger) *heartbeat.Held[jetstream.Msg] {
	return heartbeat.New(every, jetstream.Msg.Reply, func(_ context.Context, msgs []jetstream.Msg) {
		// InProgress is a publish: it fails only when the connection cannot
		// take it (closed, or its reconnect buffer full). The next beat
		// tries again, two of which come before the AckWait runs out.
		failed, last := 0, error(nil)
		for _, m := range msgs {
			if err := m.InProgress(); err != nil {
				failed, last = failed+1, err
			}
		}
		if failed > 0 {
			log.Warn("natsdedup: heartbeat not sent; these messages may be delivered again while held",
				slog.Int("messages", failed), slog.Any("error", last))
		}
	})
}
