package lambdastreamdedup_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/lambdastreamdedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// dynamoWrapper records each record's eventName by eventID, failing the
// eventIDs in fail for as many calls as it says (-1: always).
func dynamoWrapper(t *testing.T, rec *adaptertest.Effects, sink dedup.Sink, fail map[string]int) *dedup.Wrapper[events.DynamoDBEventRecord] {
	t.Helper()
	w, err := dedup.Wrap(dedup.NewMemoryStore(), lambdastreamdedup.DynamoDBMessages(),
		func(_ context.Context, r events.DynamoDBEventRecord) error {
			n := rec.Call(r.EventID)
			if left := fail[r.EventID]; left < 0 || n <= left {
				return dedup.Permanent(errTest)
			}
			rec.Apply(r.EventID)
			return nil
		}, dedup.WithScope(uniqueScope()), dedup.WithSink(sink), dedup.WithMaxAttempts(3), dedup.WithObserver(rec.Observe))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

var errTest = errors.New("refused")

// A realistic DynamoDB Streams batch (one item's INSERT, MODIFY, REMOVE):
// the MODIFY fails once, so its sequence number is reported and the REMOVE
// waits; retried from there, the MODIFY runs again and the REMOVE once.
func TestDynamoDBStreamOrder(t *testing.T) {
	var ev events.DynamoDBEvent
	readJSON(t, "dynamodb-stream-event.json", &ev)
	rec := adaptertest.NewEffects()
	modify := ev.Records[1].EventID
	h := lambdastreamdedup.DynamoDBHandler(retryOnce(t, rec, modify))
	resp, err := h(context.Background(), ev)
	if err != nil || len(resp.BatchItemFailures) != 1 || resp.BatchItemFailures[0].ItemIdentifier != ev.Records[1].Change.SequenceNumber {
		t.Fatalf("response %+v, %v; want the MODIFY's sequence number", resp, err)
	}
	if rec.Calls(ev.Records[2].EventID) != 0 {
		t.Fatal("the REMOVE ran before the MODIFY settled")
	}
	resp, err = h(context.Background(), events.DynamoDBEvent{Records: ev.Records[1:]})
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("retry: response %+v, %v", resp, err)
	}
	rec.AssertOnce(t, []string{ev.Records[0].EventID, modify, ev.Records[2].EventID})
}

// retryOnce wraps a handler that fails id's first call with a retryable
// error.
func retryOnce(t *testing.T, rec *adaptertest.Effects, id string) *dedup.Wrapper[events.DynamoDBEventRecord] {
	t.Helper()
	w, err := dedup.Wrap(dedup.NewMemoryStore(), lambdastreamdedup.DynamoDBMessages(),
		func(_ context.Context, r events.DynamoDBEventRecord) error {
			if rec.Call(r.EventID) == 1 && r.EventID == id {
				return errTest
			}
			rec.Apply(r.EventID)
			return nil
		}, dedup.WithScope(uniqueScope()), dedup.WithSink(dedup.NewMemorySink()))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// A poison record is parked with its stream ARN, sequence number and event
// name, the whole record as the payload, and the stream goes on.
func TestDynamoDBPoisonLetter(t *testing.T) {
	var ev events.DynamoDBEvent
	readJSON(t, "dynamodb-stream-event.json", &ev)
	rec := adaptertest.NewEffects()
	sink := dedup.NewMemorySink()
	poison := ev.Records[0]
	h := lambdastreamdedup.DynamoDBHandler(dynamoWrapper(t, rec, sink, map[string]int{poison.EventID: -1}))
	resp, err := h(context.Background(), ev)
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("response %+v, %v", resp, err)
	}
	rec.AssertOnce(t, []string{ev.Records[1].EventID, ev.Records[2].EventID})
	letters := sink.Letters()
	if len(letters) != 1 {
		t.Fatalf("%d letters", len(letters))
	}
	l := letters[0]
	var back events.DynamoDBEventRecord
	if err := json.Unmarshal(l.Payload, &back); err != nil || back.EventID != poison.EventID || back.Change.NewImage["status"].String() != "placed" {
		t.Errorf("letter payload %s: %v", l.Payload, err)
	}
	want := []dedup.Header{
		{Key: lambdastreamdedup.HeaderSequence, Value: []byte(poison.Change.SequenceNumber), Type: "String"},
		{Key: lambdastreamdedup.HeaderStreamARN, Value: []byte(poison.EventSourceArn), Type: "String"},
		{Key: lambdastreamdedup.HeaderEventName, Value: []byte("INSERT"), Type: "String"},
	}
	if !slices.EqualFunc(l.Headers, want, func(a, b dedup.Header) bool { return a.Key == b.Key && string(a.Value) == string(b.Value) }) ||
		l.Reason != dedup.ReasonPermanent || l.EventID != poison.EventID || l.Origin.Stream != poison.EventSourceArn {
		t.Errorf("letter %+v", l)
	}
}

// aws-lambda-go's own fixture gives every record one sequence number (real
// records never share one) but distinct eventIDs: each record is still one
// event, and the batch settles.
func TestDynamoDBFixture(t *testing.T) {
	var ev events.DynamoDBEvent
	readJSON(t, "dynamodb-event.json", &ev)
	rec := adaptertest.NewEffects()
	h := lambdastreamdedup.DynamoDBHandler(dynamoWrapper(t, rec, dedup.NewMemorySink(), nil))
	for range 2 {
		if resp, err := h(context.Background(), ev); err != nil || len(resp.BatchItemFailures) != 0 {
			t.Fatalf("response %+v, %v", resp, err)
		}
	}
	var ids []string
	for _, r := range ev.Records {
		ids = append(ids, r.EventID)
	}
	rec.AssertOnce(t, ids)
	if rec.Outcomes(dedup.OutcomeDuplicate) != len(ids) {
		t.Errorf("%d duplicates on the second invocation, want %d", rec.Outcomes(dedup.OutcomeDuplicate), len(ids))
	}
}
