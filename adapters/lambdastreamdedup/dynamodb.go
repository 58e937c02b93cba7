package lambdastreamdedup

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/aws/aws-lambda-go/events"

	"github.com/dedupkit/dedup"
)

// DynamoDBMessages returns how a dedup.Wrapper reads the records of a
// Lambda DynamoDB Streams event: the event ID is the record's eventID, the
// payload its change as JSON (the "dynamodb" object: keys, images, sequence
// number), and a dead letter holds the whole record as JSON, its keys as
// JSON as its message key, and the sequence number, stream ARN and event
// name as headers ([HeaderSequence], [HeaderStreamARN], [HeaderEventName]).
// A DynamoDB Streams record names no shard. Its origin names the stream
// (dedup-origin-stream) and the eventID (dedup-origin-message-id).
func DynamoDBMessages() dedup.Messages[events.DynamoDBEventRecord] {
	return dedup.Messages[events.DynamoDBEventRecord]{
		EventID: func(r events.DynamoDBEventRecord) (string, error) {
			if r.EventID == "" {
				return "", fmt.Errorf("%w: no eventID", ErrNoEventID)
			}
			return r.EventID, nil
		},
		Payload: func(r events.DynamoDBEventRecord) []byte { return marshal(r.Change) },
		DeadLetter: func(r events.DynamoDBEventRecord) dedup.DeadLetter {
			return dedup.DeadLetter{
				Payload:    marshal(r),
				MessageKey: marshal(r.Change.Keys),
				Headers: headers(HeaderSequence, r.Change.SequenceNumber, HeaderStreamARN, r.EventSourceArn,
					HeaderEventName, r.EventName),
				Origin: dedup.Origin{Stream: r.EventSourceArn, MessageID: r.EventID,
					Timestamp: r.Change.ApproximateCreationDateTime.Time},
			}
		},
	}
}

// marshal returns v as JSON, or nil when it has none (an attribute value
// of no known type, which no record Lambda decoded holds).
func marshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	return b
}

// DynamoDBHandler returns a Lambda handler for DynamoDB Streams events, as
// [KinesisHandler] is for Kinesis: the records run in order, and the
// sequence number of the first that did not settle is the one batch item
// failure reported. A DynamoDB Streams batch comes from one shard, which the
// records do not name: the stream ARN stands for it.
func DynamoDBHandler(w *dedup.Wrapper[events.DynamoDBEventRecord]) func(context.Context, events.DynamoDBEvent) (events.DynamoDBEventResponse, error) {
	p := newPolicy()
	return func(ctx context.Context, ev events.DynamoDBEvent) (events.DynamoDBEventResponse, error) {
		if w == nil {
			return events.DynamoDBEventResponse{}, nilWrapper("DynamoDBHandler")
		}
		var resp events.DynamoDBEventResponse
		shard := func(r events.DynamoDBEventRecord) string { return r.EventSourceArn }
		for _, seq := range run(ctx, w, p, ev.Records, shard, func(r events.DynamoDBEventRecord) string { return r.Change.SequenceNumber }) {
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.DynamoDBBatchItemFailure{ItemIdentifier: seq})
		}
		return resp, nil
	}
}
