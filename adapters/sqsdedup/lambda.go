package sqsdedup

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"go.opentelemetry.io/otel/propagation"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/group"
)

// LambdaMessages returns how a dedup.Wrapper reads the SQS records of a
// Lambda event, as [Messages] does for received messages. A dead letter's
// origin names the queue by its ARN (EventSourceARN), which is what the
// event carries. To compute the event ID yourself, replace the EventID field
// of the result.
func LambdaMessages(opts ...MessagesOpt) dedup.Messages[events.SQSMessage] {
	src := newIDSource(opts)
	return withEnvelope(src, dedup.Messages[events.SQSMessage]{
		EventID: func(m events.SQSMessage) (string, error) {
			return src.eventID(m.MessageId, func(name string) (string, bool) {
				v, ok := m.MessageAttributes[name]
				return string(attributeBytes(v.StringValue, v.BinaryValue)), ok
			}, m.Attributes)
		},
		Payload:  func(m events.SQSMessage) []byte { return []byte(m.Body) },
		Attempts: func(m events.SQSMessage) int { return receiveCount(m.Attributes) },
		DeadLetter: func(m events.SQSMessage) dedup.DeadLetter {
			headers := make([]dedup.Header, 0, len(m.MessageAttributes))
			for name, v := range m.MessageAttributes {
				headers = append(headers, dedup.Header{Key: name, Value: attributeBytes(v.StringValue, v.BinaryValue), Type: v.DataType})
			}
			return deadLetter(m.Body, headers, m.Attributes,
				dedup.Origin{QueueURL: m.EventSourceARN, MessageID: m.MessageId})
		},
		TraceCarrier: func(m events.SQSMessage) propagation.TextMapCarrier { return lambdaCarrier(m.MessageAttributes) },
	}, func(m events.SQSMessage) string { return m.Body })
}

// lambdaCarrier reads a Lambda SQS record's attributes as attributeCarrier
// reads a received message's.
type lambdaCarrier map[string]events.SQSMessageAttribute

func (c lambdaCarrier) Get(key string) string {
	v := c[key]
	return string(attributeBytes(v.StringValue, v.BinaryValue))
}

func (c lambdaCarrier) Set(key, value string) {
	c[key] = events.SQSMessageAttribute{DataType: "String", StringValue: &value}
}

func (c lambdaCarrier) Keys() []string { return slices.Collect(maps.Keys(c)) }

// LambdaHandler returns a Lambda handler for SQS events (pass it to
// lambda.Start) that runs the records through w in order and reports those
// that did not settle (OutcomeRetry, OutcomeInFlight, or an error) as batch
// item failures, so that Lambda deletes the others and only those come back,
// after their visibility timeout. The event source mapping must have
// ReportBatchItemFailures enabled, or Lambda deletes the whole batch. On a
// FIFO queue, a record that does not settle also fails the records after it
// in its message group, which are not run, so the group keeps its order. The
// handler never returns an error: that would fail the whole batch.
//
// The store lease defaults to the invocation's remaining time (its
// context's deadline) unless dedup.WithLease is set. A nil w makes every
// invocation fail with dedup.ErrConfig.
func LambdaHandler(w *dedup.Wrapper[events.SQSMessage]) func(context.Context, events.SQSEvent) (events.SQSEventResponse, error) {
	return func(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
		if w == nil {
			return events.SQSEventResponse{}, fmt.Errorf("%w: sqsdedup.LambdaHandler: nil wrapper", dedup.ErrConfig)
		}
		var resp events.SQSEventResponse
		fail := func(recs ...events.SQSMessage) {
			for _, rec := range recs {
				resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: rec.MessageId})
			}
		}
		for _, g := range lambdaGroups(ev.Records) {
			fifo := len(g) > 0 && strings.HasSuffix(g[0].EventSourceARN, ".fifo")
			next := 0
			// An error here (the batch claim failed) ran nothing: all of g fail.
			_ = w.HandleBatch(ctx, g, func(i int, res dedup.Result, err error) bool {
				next = i + 1
				if err != nil || !res.Settled() {
					fail(g[i])
					return !fifo
				}
				return true
			})
			fail(g[next:]...)
		}
		return resp, nil
	}
}

// lambdaGroups splits FIFO records by MessageGroupId, keeping their order;
// records of a standard queue form one group.
func lambdaGroups(recs []events.SQSMessage) [][]events.SQSMessage {
	return group.By(recs, func(rec events.SQSMessage) string {
		g, ok := rec.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
		if !strings.HasSuffix(rec.EventSourceARN, ".fifo") || !ok {
			return ""
		}
		return g
	})
}
