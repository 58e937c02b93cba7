package sqsdedup_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/deduptest"
)

// The SQS consumer and the Lambda handler under the two concurrency faults
// of issue 9: many deliveries of one failing event at once, and a worker
// that lost its lease before its handler failed.

const (
	racing      = 20
	maxAttempts = 3
)

// Twenty SQS messages carrying one event ID, all failing, consumed by three
// consumers at once: the handler starts at most MaxAttempts times and the
// event is dead-lettered once; every message is deleted.
func TestConsumersRaceOnFailingEvent(t *testing.T) {
	c := client(t)
	url := queue(t, c)
	store, sink := dedup.NewMemoryStore(), dedup.NewMemorySink()
	var starts atomic.Int32
	w := wrap(t, store, url, adaptertest.NewEffects(), func(ctx context.Context, m types.Message) error {
		starts.Add(1)
		time.Sleep(5 * time.Millisecond)
		return errors.New("downstream refused")
	}, dedup.WithSink(sink), dedup.WithMaxAttempts(maxAttempts))
	for range racing {
		send(t, c, url, "poison", "same body", nil)
	}
	for range 3 {
		start(t, c, url, w)
	}
	assertDrained(t, c, url)
	rec, err := store.Get(context.Background(), dedup.Key{Scope: w.Scope(), EventID: "poison"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("handler starts %d, dead letters %d, record attempts %d", starts.Load(), len(sink.Letters()), rec.Attempts)
	if n := starts.Load(); n > maxAttempts || int(n) != rec.Attempts {
		t.Errorf("handler started %d times, record counts %d attempts; want at most %d, equal", n, rec.Attempts, maxAttempts)
	}
	if n := len(sink.Letters()); n != 1 || rec.Status != dedup.StatusFailedFinal {
		t.Errorf("%d dead letters, record %s; want 1, FAILED_FINAL", n, rec.Status)
	}
}

// lambdaEvent is one invocation's event: a failing event twice (a producer
// retry) and one of its own.
func lambdaEvent(arn string, n int) events.SQSEvent {
	return events.SQSEvent{Records: []events.SQSMessage{
		record(arn, fmt.Sprintf("m%d-a", n), "poison", ""),
		record(arn, fmt.Sprintf("m%d-b", n), "poison", ""),
		record(arn, fmt.Sprintf("m%d-c", n), fmt.Sprintf("own-%d", n), ""),
	}}
}

// Twenty concurrent invocations, each redelivering its failed records until
// none fails: the failing event starts at most MaxAttempts times and is
// dead-lettered once.
func TestLambdaInvocationsRaceOnFailingEvent(t *testing.T) {
	const arn = "arn:aws:sqs:us-east-1:000000000000:orders"
	store, sink := dedup.NewMemoryStore(), dedup.NewMemorySink()
	var starts atomic.Int32
	w, err := dedup.Wrap(store, sqsdedup.LambdaMessages(), func(ctx context.Context, m events.SQSMessage) error {
		if *m.MessageAttributes["event-id"].StringValue != "poison" {
			return nil
		}
		starts.Add(1)
		time.Sleep(5 * time.Millisecond)
		return errors.New("downstream refused")
	}, dedup.WithScope(uniqueScope()), dedup.WithSink(sink), dedup.WithMaxAttempts(maxAttempts))
	if err != nil {
		t.Fatal(err)
	}
	h := sqsdedup.LambdaHandler(w)
	var wg sync.WaitGroup
	for n := range racing {
		wg.Go(func() {
			ev := lambdaEvent(arn, n)
			for range 100 {
				resp, err := h(context.Background(), ev)
				if err != nil {
					t.Error(err)
					return
				}
				failed := map[string]bool{}
				for _, f := range resp.BatchItemFailures {
					failed[f.ItemIdentifier] = true
				}
				var again []events.SQSMessage
				for _, r := range ev.Records {
					if failed[r.MessageId] {
						again = append(again, r)
					}
				}
				if len(again) == 0 {
					return
				}
				ev.Records = again
				time.Sleep(10 * time.Millisecond)
			}
			t.Error("records never settled")
		})
	}
	wg.Wait()
	rec, err := store.Get(context.Background(), dedup.Key{Scope: w.Scope(), EventID: "poison"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("handler starts %d, dead letters %d, record attempts %d", starts.Load(), len(sink.Letters()), rec.Attempts)
	if n := starts.Load(); n > maxAttempts || int(n) != rec.Attempts {
		t.Errorf("handler started %d times, record counts %d attempts; want at most %d, equal", n, rec.Attempts, maxAttempts)
	}
	if n := len(sink.Letters()); n != 1 {
		t.Errorf("%d dead letters, want 1", n)
	}
}

// An invocation stalls past its lease; twenty others race and one
// completes the event; then the stalled one's handler returns a permanent
// error. It must report the record as failed and write no dead letter.
func TestLambdaStaleInvocationWritesNoDeadLetter(t *testing.T) {
	const arn = "arn:aws:sqs:us-east-1:000000000000:orders"
	const lease = 300 * time.Millisecond
	real := dedup.NewMemoryStore()
	stale := deduptest.NewStallingStore(real)
	sink := dedup.NewMemorySink()
	opts := []dedup.Opt{dedup.WithScope(uniqueScope()), dedup.WithSink(sink), dedup.WithLease(lease)}
	started, wake := make(chan struct{}), make(chan struct{})
	a, err := dedup.Wrap(stale, sqsdedup.LambdaMessages(), func(ctx context.Context, m events.SQSMessage) error {
		stale.Stall()
		close(started)
		<-wake
		stale.Resume()
		return dedup.Permanent(errors.New("rejected"))
	}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	b, err := dedup.Wrap(real, sqsdedup.LambdaMessages(), func(ctx context.Context, m events.SQSMessage) error { return nil }, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ev := events.SQSEvent{Records: []events.SQSMessage{record(arn, "m-a", "e", "")}}
	var aResp events.SQSEventResponse
	done := make(chan struct{})
	go func() {
		defer close(done)
		aResp, _ = sqsdedup.LambdaHandler(a)(context.Background(), ev)
	}()
	<-started
	time.Sleep(lease + 50*time.Millisecond)
	var wg sync.WaitGroup
	for n := range racing {
		wg.Go(func() {
			ev := events.SQSEvent{Records: []events.SQSMessage{record(arn, fmt.Sprintf("m-%d", n), "e", "")}}
			for range 100 {
				resp, _ := sqsdedup.LambdaHandler(b)(context.Background(), ev)
				if len(resp.BatchItemFailures) == 0 {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Error("never settled")
		})
	}
	wg.Wait()
	close(wake)
	<-done
	rec, err := real.Get(context.Background(), dedup.Key{Scope: a.Scope(), EventID: "e"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stale invocation: dead letters %d, record %s, its failures %d", len(sink.Letters()), rec.Status, len(aResp.BatchItemFailures))
	if rec.Status != dedup.StatusSucceeded || len(sink.Letters()) != 0 {
		t.Errorf("record %s with %d dead letters; want SUCCEEDED, none", rec.Status, len(sink.Letters()))
	}
	if len(aResp.BatchItemFailures) != 1 {
		t.Errorf("the stale invocation reported %d failures, want its record (not acknowledged)", len(aResp.BatchItemFailures))
	}
}
