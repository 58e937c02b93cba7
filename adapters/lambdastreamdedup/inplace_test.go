package lambdastreamdedup_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/lambdastreamdedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// invocation returns the context of an invocation with the time Lambda
// gives it (its function's timeout), as lambda.Start makes it.
func invocation(t *testing.T, timeout time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// With time left in the invocation, a record that fails is retried in
// place after its backoff, as a Kafka partition waits, instead of spending
// one of the event source mapping's retries; the poison one is parked
// within the invocation and the shard goes on.
func TestKinesisRetriesInPlace(t *testing.T) {
	h := &testHandler{rec: adaptertest.NewEffects(), fail: map[string]int{"o-1": 2, "o-3": -1}}
	sink := dedup.NewMemorySink()
	handler := lambdastreamdedup.KinesisHandler(wrapKinesis(t, dedup.NewMemoryStore(), h, sink,
		dedup.WithBackoff(func(int) time.Duration { return 10 * time.Millisecond })))
	resp, err := handler(invocation(t, 5*time.Minute), events.KinesisEvent{Records: kinesisRecords(t, "o", 5)})
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("response %+v, %v; want every record settled in one invocation", resp, err)
	}
	want := []string{"o-0", "o-1", "o-1", "o-1", "o-2", "o-3", "o-3", "o-3", "o-4"}
	if got := h.rec.CallOrder(); !slices.Equal(got, want) {
		t.Errorf("calls %v, want %v", got, want)
	}
	h.rec.AssertOnce(t, []string{"o-0", "o-1", "o-2", "o-4"})
	if l := sink.Letters(); len(l) != 1 || l[0].Attempts != 3 {
		t.Errorf("letters %+v, want o-3's after 3 attempts", l)
	}
}

// With time left, a record whose event another invocation holds (one that
// timed out and still runs) is waited for in place: once the holder
// settles it, it answers as a duplicate and the shard goes on, nothing
// reported.
func TestKinesisHeldEventWaitedInPlace(t *testing.T) {
	h := &testHandler{rec: adaptertest.NewEffects()}
	started, release := h.holdFirstCall("o-0")
	recs := kinesisRecords(t, "o", 3)
	handler := lambdastreamdedup.KinesisHandler(wrapKinesis(t, dedup.NewMemoryStore(), h, dedup.NewMemorySink(), dedup.WithLease(time.Minute)))
	first := invokeAsync(context.Background(), handler, recs[:1])
	<-started
	second := invokeAsync(invocation(t, 5*time.Minute), handler, recs)
	adaptertest.WaitFor(t, time.Minute, "the retry to find o-0 held", func() bool { return h.rec.Outcomes(dedup.OutcomeInFlight) > 0 })
	close(release)
	if resp := <-first; len(resp.BatchItemFailures) != 0 {
		t.Errorf("first invocation: %+v", resp)
	}
	if resp := <-second; len(resp.BatchItemFailures) != 0 {
		t.Errorf("second invocation: %+v, want o-0 waited for", resp)
	}
	if got := h.rec.CallOrder(); !slices.Equal(got, []string{"o-0", "o-1", "o-2"}) {
		t.Errorf("calls %v, want each record once", got)
	}
	h.rec.AssertOnce(t, []string{"o-0", "o-1", "o-2"})
}

// A record that could not be made durable (the store down) is not waited
// for in place, however much time the invocation has: it is reported at
// once, nothing runs, and Lambda's retry of the batch is its redelivery.
func TestKinesisStoreDownNotWaitedInPlace(t *testing.T) {
	store := adaptertest.NewFaultyStore(dedup.NewMemoryStore())
	store.SetDown(true)
	h := &testHandler{rec: adaptertest.NewEffects()}
	recs := kinesisRecords(t, "o", 3)
	handler := lambdastreamdedup.KinesisHandler(wrapKinesis(t, store, h, dedup.NewMemorySink(),
		dedup.WithBackoff(func(int) time.Duration { return 10 * time.Millisecond })))
	start := time.Now()
	resp, err := handler(invocation(t, 5*time.Minute), events.KinesisEvent{Records: recs})
	if err != nil || len(resp.BatchItemFailures) != 1 || resp.BatchItemFailures[0].ItemIdentifier != recs[0].Kinesis.SequenceNumber {
		t.Fatalf("response %+v, %v; want the first record reported", resp, err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("invocation took %v; want the failure reported, not waited for", took)
	}
	if n := h.rec.CallCount(); n != 0 {
		t.Errorf("%d handler calls with the store down, want none", n)
	}
}
