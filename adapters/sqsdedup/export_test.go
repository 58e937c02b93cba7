package sqsdedup

import (
	"context"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup"
)

// HandleGroup runs msgs, held by one receive, through c as one FIFO message
// group, with stop standing for Run's context, and returns once their
// deletes are flushed.
func HandleGroup(c *Consumer, stop context.Context, vis time.Duration, msgs []types.Message) {
	r := c.start(context.Background(), vis)
	r.slots.TryTake(len(msgs)) // the receive took them
	r.hb.Add(msgs...)
	r.handleGroup(stop, msgs)
	r.stop()
}

// SinkInput returns the SendMessageInput s would send for dl, without
// sending anything.
func SinkInput(s *Sink, dl dedup.DeadLetter) (*sqs.SendMessageInput, error) { return s.input(&dl) }
