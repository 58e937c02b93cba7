package sqsdedup

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup/internal/sqsbody"
)

const (
	// maxBatch is SQS's limit of entries per batch call.
	maxBatch = 10
	// callTimeout bounds one SQS call made on the consumer's own behalf.
	callTimeout = 10 * time.Second
	// maxVisibility is SQS's longest visibility timeout.
	maxVisibility = 12 * time.Hour
)

// batchCall makes one batch call for msgs, with each entry's ID its index,
// and returns the IDs SQS acted on and the entries it reported as failed.
type batchCall func(ctx context.Context, msgs []types.Message) (ok []string, failed []types.BatchResultErrorEntry, err error)

// retryBatch makes call for msgs (at most 10), then again for the entries
// that failed through no fault of the request, up to attempts calls in all:
// a batch call can fail entry by entry behind a success. It returns the
// messages SQS never acted on; none is assumed done unless SQS said so.
func (r *runner) retryBatch(ctx context.Context, op string, msgs []types.Message, attempts int, call batchCall) (lost []types.Message) {
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		ok, failed, err := call(cctx, msgs)
		cancel()
		retry := msgs
		if err == nil {
			retry = nil
			done := make(map[string]bool, len(ok))
			for _, id := range ok {
				done[id] = true
			}
			why := make(map[string]types.BatchResultErrorEntry, len(failed))
			for _, f := range failed {
				why[aws.ToString(f.Id)] = f
			}
			for i, m := range msgs {
				id := strconv.Itoa(i)
				if done[id] {
					continue
				}
				if f, ok := why[id]; ok && f.SenderFault {
					r.log.Warn("sqsdedup: "+op+" refused for a message", slog.String("message_id", aws.ToString(m.MessageId)),
						slog.String("code", aws.ToString(f.Code)), slog.String("reason", aws.ToString(f.Message)))
					lost = append(lost, m)
					continue
				}
				retry = append(retry, m)
			}
		}
		if len(retry) == 0 {
			return lost
		}
		if attempt >= attempts || sleep(ctx, time.Duration(50<<attempt)*time.Millisecond) != nil {
			r.log.Warn("sqsdedup: "+op+" failed; giving up on these messages", slog.Int("messages", len(retry)),
				slog.Int("attempts", attempt), slog.Any("error", err))
			return append(lost, retry...)
		}
		r.log.Debug("sqsdedup: "+op+" failed; retrying", slog.Int("messages", len(retry)), slog.Any("error", err))
		msgs = retry
	}
}

// deleteCall deletes msgs with one DeleteMessageBatch.
func (r *runner) deleteCall(ctx context.Context, msgs []types.Message) ([]string, []types.BatchResultErrorEntry, error) {
	entries := make([]types.DeleteMessageBatchRequestEntry, len(msgs))
	for i, m := range msgs {
		entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
	}
	out, err := r.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(r.url), Entries: entries}, sqsbody.KeepConnection)
	if err != nil {
		return nil, nil, err
	}
	return succeeded(out.Successful, func(e types.DeleteMessageBatchResultEntry) *string { return e.Id }), out.Failed, nil
}

// succeeded returns the IDs of a batch call's successful entries.
func succeeded[E any](entries []E, id func(E) *string) []string {
	ids := make([]string, len(entries))
	for i, e := range entries {
		ids[i] = aws.ToString(id(e))
	}
	return ids
}

// visibilityCall returns a call that sets the visibility timeout of msgs to
// d with one ChangeMessageVisibilityBatch.
func (r *runner) visibilityCall(d time.Duration) batchCall {
	secs := seconds(d)
	return func(ctx context.Context, msgs []types.Message) ([]string, []types.BatchResultErrorEntry, error) {
		entries := make([]types.ChangeMessageVisibilityBatchRequestEntry, len(msgs))
		for i, m := range msgs {
			entries[i] = types.ChangeMessageVisibilityBatchRequestEntry{
				Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: secs,
			}
		}
		out, err := r.client.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{
			QueueUrl: aws.String(r.url), Entries: entries,
		}, sqsbody.KeepConnection)
		if err != nil {
			return nil, nil, err
		}
		return succeeded(out.Successful, func(e types.ChangeMessageVisibilityBatchResultEntry) *string { return e.Id }), out.Failed, nil
	}
}

// chunks splits msgs into batches of at most 10.
func chunks(msgs []types.Message) [][]types.Message {
	var out [][]types.Message
	for len(msgs) > maxBatch {
		out = append(out, msgs[:maxBatch])
		msgs = msgs[maxBatch:]
	}
	if len(msgs) > 0 {
		out = append(out, msgs)
	}
	return out
}

// seconds rounds d up to whole seconds within SQS's visibility range.
func seconds(d time.Duration) int32 {
	d = min(max(d, 0), maxVisibility)
	return int32((d + time.Second - 1) / time.Second)
}

// sleep waits for d or until ctx is done, and returns ctx's error then.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
