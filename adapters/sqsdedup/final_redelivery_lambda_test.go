package sqsdedup_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// Through Lambda too, a dead letter moved back to its queue (its packed
// dedup-metadata attribute kept) while its event is FAILED_FINAL is
// dead-lettered again without running, beside a plain copy acknowledged in
// the same invocation.
func TestFinalRedeliveryLambda(t *testing.T) {
	const arn = "arn:aws:sqs:us-east-1:000000000000:orders"
	sink, logs, rec := dedup.NewMemorySink(), &testenv.Logs{}, adaptertest.NewEffects()
	w, err := dedup.Wrap(dedup.NewMemoryStore(), sqsdedup.LambdaMessages(), func(_ context.Context, m events.SQSMessage) error {
		rec.Call(m.MessageId)
		return dedup.Permanent(errInjected)
	}, dedup.WithScope(uniqueScope()), dedup.WithSink(sink), dedup.WithLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	h := sqsdedup.LambdaHandler(w)
	invoke := func(recs ...events.SQSMessage) {
		t.Helper()
		resp, err := h(context.Background(), events.SQSEvent{Records: recs})
		if err != nil || len(resp.BatchItemFailures) > 0 {
			t.Fatalf("invocation: %v, failures %v", err, resp.BatchItemFailures)
		}
	}
	invoke(record(arn, "m1", "bad-1", ""))
	meta := `{"dedup-reason":"permanent","dedup-event-id":"bad-1","dedup-scope":"` + w.Scope() + `"}`
	moved := record(arn, "m3", "bad-1", "")
	moved.MessageAttributes[sqsdedup.MetadataAttribute] = events.SQSMessageAttribute{DataType: "String", StringValue: &meta}
	invoke(record(arn, "m2", "bad-1", ""), moved)

	letters := sink.Letters()
	if len(letters) != 2 || letters[1].Reason != dedup.ReasonRedeliveredAfterFinal || letters[1].Origin.MessageID != "m3" {
		t.Fatalf("letters %+v, want the first and m3's, redelivered-after-final", letters)
	}
	if n := rec.CallCount(); n != 1 {
		t.Errorf("the handler ran %d times, want once", n)
	}
	requireFinalWarnings(t, logs, dedup.Key{Scope: w.Scope(), EventID: "bad-1"})
}
