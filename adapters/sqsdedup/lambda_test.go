package sqsdedup_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/adaptertest"
)

func record(arn, id, eventID, group string) events.SQSMessage {
	v := eventID
	m := events.SQSMessage{
		MessageId: id, Body: "body of " + eventID, EventSourceARN: arn,
		Attributes:        map[string]string{"ApproximateReceiveCount": "1"},
		MessageAttributes: map[string]events.SQSMessageAttribute{"event-id": {DataType: "String", StringValue: &v}},
	}
	if group != "" {
		m.Attributes["MessageGroupId"] = group
	}
	return m
}

// lambdaWrapper fails the events named in failing and records calls.
func lambdaWrapper(t *testing.T, rec *adaptertest.Effects, failing ...string) *dedup.Wrapper[events.SQSMessage] {
	t.Helper()
	w, err := dedup.Wrap(dedup.NewMemoryStore(), sqsdedup.LambdaMessages(),
		func(ctx context.Context, m events.SQSMessage) error {
			id := *m.MessageAttributes["event-id"].StringValue
			rec.Call(id)
			if slices.Contains(failing, id) {
				return errors.New("fails")
			}
			rec.Apply(id)
			return nil
		}, dedup.WithScope(uniqueScope()), dedup.WithSink(dedup.NewMemorySink()))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func failedIDs(resp events.SQSEventResponse) []string {
	var ids []string
	for _, f := range resp.BatchItemFailures {
		ids = append(ids, f.ItemIdentifier)
	}
	return ids
}

// Only records that did not settle are reported; a duplicate settles.
func TestLambdaReportsOnlyUnsettledRecords(t *testing.T) {
	const arn = "arn:aws:sqs:us-east-1:000000000000:orders"
	rec := adaptertest.NewEffects()
	h := sqsdedup.LambdaHandler(lambdaWrapper(t, rec, "e2"))
	resp, err := h(context.Background(), events.SQSEvent{Records: []events.SQSMessage{
		record(arn, "m1", "e1", ""), record(arn, "m2", "e2", ""),
		record(arn, "m3", "e3", ""), record(arn, "m4", "e1", ""),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got := failedIDs(resp); !slices.Equal(got, []string{"m2"}) {
		t.Errorf("batch item failures %v, want [m2]", got)
	}
	if rec.Count("e1") != 1 || rec.Count("e3") != 1 {
		t.Errorf("effects %v", rec.Counts())
	}
}

// On a FIFO queue, a failed record fails the rest of its group, unrun;
// other groups go on.
func TestLambdaFIFOHoldsBackGroup(t *testing.T) {
	const arn = "arn:aws:sqs:us-east-1:000000000000:orders.fifo"
	rec := adaptertest.NewEffects()
	h := sqsdedup.LambdaHandler(lambdaWrapper(t, rec, "a2"))
	resp, err := h(context.Background(), events.SQSEvent{Records: []events.SQSMessage{
		record(arn, "m1", "a1", "A"), record(arn, "m2", "b1", "B"), record(arn, "m3", "a2", "A"),
		record(arn, "m4", "b2", "B"), record(arn, "m5", "a3", "A"),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got := failedIDs(resp); !slices.Equal(got, []string{"m3", "m5"}) {
		t.Errorf("batch item failures %v, want [m3 m5]", got)
	}
	if got := rec.CallOrder(); !slices.Equal(got, []string{"a1", "a2", "b1", "b2"}) {
		t.Errorf("handler calls %v, want [a1 a2 b1 b2]", got)
	}
}

// An invocation whose context is already done runs nothing and fails every
// record, so that all come back.
func TestLambdaCancelledFailsAll(t *testing.T) {
	const arn = "arn:aws:sqs:us-east-1:000000000000:orders"
	rec := adaptertest.NewEffects()
	h := sqsdedup.LambdaHandler(lambdaWrapper(t, rec))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	resp, _ := h(ctx, events.SQSEvent{Records: []events.SQSMessage{record(arn, "m1", "e1", ""), record(arn, "m2", "e2", "")}})
	if got := failedIDs(resp); !slices.Equal(got, []string{"m1", "m2"}) {
		t.Errorf("batch item failures %v, want [m1 m2]", got)
	}
	if len(rec.CallOrder()) != 0 {
		t.Errorf("handler ran: %v", rec.CallOrder())
	}
}

func TestLambdaNilWrapper(t *testing.T) {
	if _, err := sqsdedup.LambdaHandler(nil)(context.Background(), events.SQSEvent{}); !errors.Is(err, dedup.ErrConfig) {
		t.Errorf("nil wrapper: %v, want ErrConfig", err)
	}
}
