package sqsdedup

import (
	"context"
	"log/slog"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup/internal/heartbeat"
)

// newHeartbeat returns what keeps the messages r holds invisible: every
// third of the visibility timeout it extends them all to a full timeout,
// until each is removed (deleted, given back, or delayed for a retry).
func newHeartbeat(r *runner) *heartbeat.Held[types.Message] {
	return heartbeat.New(r.vis/3, func(m types.Message) string { return aws.ToString(m.ReceiptHandle) },
		func(ctx context.Context, msgs []types.Message) {
			// One attempt per beat: a failed entry is retried by the next
			// beat, two more of which come before the timeout runs out.
			for _, batch := range chunks(msgs) {
				if lost := r.retryBatch(ctx, "visibility heartbeat", batch, 1, r.visibilityCall(r.vis)); len(lost) > 0 {
					r.log.Warn("sqsdedup: visibility not extended; these messages may be delivered again while held",
						slog.Int("messages", len(lost)))
				}
			}
		})
}
