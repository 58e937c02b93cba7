package sqsdedup

import (
	"context"
	"log/slog"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

const (
	// deleteAttempts bounds the DeleteMessageBatch calls made for one
	// message. A message never deleted comes back, and is then deleted as a
	// duplicate.
	deleteAttempts = 5
	// flushTimeout bounds the last deletes at shutdown.
	flushTimeout = 10 * time.Second
)

// deleter deletes settled messages in batches of up to 10, sent when full or
// when the oldest has waited the delete interval.
type deleter struct {
	r    *runner
	in   chan types.Message
	quit chan struct{}
	done chan struct{}
}

func newDeleter(r *runner) *deleter {
	return &deleter{
		r:    r,
		in:   make(chan types.Message, r.cfg.workers),
		quit: make(chan struct{}),
		done: make(chan struct{}),
	}
}

// add queues m for deletion; it stays in the heartbeat until its delete is
// sent.
func (d *deleter) add(m types.Message) {
	select {
	case d.in <- m:
	case <-d.quit:
		d.r.log.Warn("sqsdedup: settled after shutdown, not deleted; it will come back as a duplicate",
			slog.String("message_id", aws.ToString(m.MessageId)))
		d.r.hb.Remove(m)
	}
}

// stop deletes what is queued, within flushTimeout, and stops the deleter.
func (d *deleter) stop() {
	close(d.quit)
	<-d.done
}

func (d *deleter) run(ctx context.Context) {
	defer close(d.done)
	var batch []types.Message
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case m := <-d.in:
			batch = append(batch, m)
			if len(batch) == 1 {
				timer.Reset(d.r.cfg.deleteInterval)
			}
			if len(batch) < maxBatch {
				continue
			}
			timer.Stop()
		case <-timer.C:
		case <-d.quit:
			for len(d.in) > 0 {
				batch = append(batch, <-d.in)
			}
			ctx, cancel := context.WithTimeout(ctx, flushTimeout)
			defer cancel()
			d.flush(ctx, batch)
			return
		}
		d.flush(ctx, batch)
		batch = nil
	}
}

func (d *deleter) flush(ctx context.Context, msgs []types.Message) {
	for _, batch := range chunks(msgs) {
		// A heartbeat racing with the delete would be refused for messages
		// already gone, and warn that they may be delivered again.
		d.r.hb.Remove(batch...)
		if lost := d.r.retryBatch(ctx, "delete", batch, deleteAttempts, d.r.deleteCall); len(lost) > 0 {
			d.r.log.Warn("sqsdedup: messages not deleted; they will come back and be deleted as duplicates",
				slog.Int("messages", len(lost)))
		}
	}
}
