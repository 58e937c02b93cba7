package sqsdedup_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go/middleware"
	"go.uber.org/goleak"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/awsfault"
	"github.com/dedupkit/dedup/internal/testenv"
)

// Three copies of each of five events, handled by ten workers at once,
// give one effect per event; every copy is deleted.
func TestDuplicatesHaveOneEffect(t *testing.T) {
	t.Parallel()
	for _, sc := range stores() {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			c := client(t)
			url := queue(t, c)
			rec := adaptertest.NewEffects()
			w := wrap(t, sc.open(t), url, rec, func(ctx context.Context, m types.Message) error {
				time.Sleep(50 * time.Millisecond) // let copies overlap
				rec.Apply(eventID(m))
				return nil
			})
			const events, copies = 5, 3
			for i := range events * copies {
				send(t, c, url, fmt.Sprintf("evt-%d", i%events), fmt.Sprintf("body %d", i%events), nil)
			}
			stop := start(t, c, url, w)
			adaptertest.WaitFor(t, 20*time.Second, "every copy settled", func() bool {
				return rec.Outcomes(dedup.OutcomeProcessed) == events && rec.Outcomes(dedup.OutcomeDuplicate) == events*(copies-1)
			})
			stop()
			for i := range events {
				if n := rec.Count(fmt.Sprintf("evt-%d", i)); n != 1 {
					t.Errorf("evt-%d: %d effects, want 1", i, n)
				}
			}
			assertDrained(t, c, url)
		})
	}
}

// A handler taking 5 s on a queue with a 2 s visibility timeout keeps its
// message: it is received once and has one effect.
func TestHeartbeatKeepsSlowMessage(t *testing.T) {
	t.Parallel()
	c := client(t)
	url := queue(t, c)
	rec := adaptertest.NewEffects()
	w := wrap(t, dedup.NewMemoryStore(), url, rec, func(ctx context.Context, m types.Message) error {
		time.Sleep(5 * time.Second)
		rec.Apply(eventID(m))
		return nil
	})
	send(t, c, url, "slow-1", "slow", nil)
	stop := start(t, c, url, w, sqsdedup.WithPollers(2))
	adaptertest.WaitFor(t, 15*time.Second, "the slow message processed", func() bool { return rec.Outcomes(dedup.OutcomeProcessed) == 1 })
	stop()
	if results := rec.Results(); results != 1 {
		t.Errorf("%d deliveries, want 1 (the message was delivered again while held)", results)
	}
	if n := rec.Count("slow-1"); n != 1 {
		t.Errorf("%d effects, want 1", n)
	}
	assertDrained(t, c, url)
}

// A consumer stopped before it could delete a processed message (every
// delete fails) leaves it in the queue; the next consumer sees it again as a
// duplicate, without a second effect, and deletes it.
func TestRedeliveryAfterStopBeforeDelete(t *testing.T) {
	t.Parallel()
	for _, sc := range stores() {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			noDelete := awsfault.Fail(errInjected, "DeleteMessageBatch")
			noDelete.On()
			c1 := client(t, noDelete.APIOption)
			url := queue(t, c1)
			store := sc.open(t)
			rec := adaptertest.NewEffects()
			scope := dedup.WithScope(uniqueScope())
			h := func(ctx context.Context, m types.Message) error {
				rec.Apply(eventID(m))
				return nil
			}
			send(t, c1, url, "evt-1", "once", nil)

			stop := start(t, c1, url, wrap(t, store, url, rec, h, scope))
			adaptertest.WaitFor(t, 10*time.Second, "processed and a delete tried", func() bool {
				return rec.Outcomes(dedup.OutcomeProcessed) == 1 && noDelete.Hits() > 0
			})
			stop()

			c2 := client(t)
			stop = start(t, c2, url, wrap(t, store, url, rec, h, scope))
			adaptertest.WaitFor(t, 10*time.Second, "the redelivery seen as a duplicate", func() bool {
				return rec.Outcomes(dedup.OutcomeDuplicate) == 1
			})
			stop()
			if n := rec.Count("evt-1"); n != 1 {
				t.Errorf("%d effects, want 1", n)
			}
			assertDrained(t, c2, url)
		})
	}
}

// A message that always fails is dead-lettered after MaxAttempts with its
// body, attributes and metadata, and the original is deleted.
func TestPoisonMessageIsDeadLettered(t *testing.T) {
	t.Parallel()
	for _, sc := range stores() {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			c := client(t)
			url := queue(t, c)
			dlq := queue(t, c)
			rec := adaptertest.NewEffects()
			scope := uniqueScope()
			w := wrap(t, sc.open(t), url, rec, func(ctx context.Context, m types.Message) error {
				rec.Call(eventID(m))
				return errors.New("cannot handle this")
			}, dedup.WithScope(scope), dedup.WithMaxAttempts(3), dedup.WithSink(newSink(t, c, dlq)))
			send(t, c, url, "poison-1", `{"poison":true}`, map[string]types.MessageAttributeValue{"tenant": stringAttr("acme")})
			stop := start(t, c, url, w)
			adaptertest.WaitFor(t, 20*time.Second, "the message dead-lettered", func() bool { return rec.Outcomes(dedup.OutcomeDeadLettered) == 1 })
			stop()
			if n := len(rec.CallOrder()); n != 3 {
				t.Errorf("handler ran %d times, want 3", n)
			}

			letters := receive(t, c, dlq, time.Second)
			if len(letters) != 1 {
				t.Fatalf("DLQ holds %d messages, want 1", len(letters))
			}
			dl := letters[0]
			if got := aws.ToString(dl.Body); got != `{"poison":true}` {
				t.Errorf("body %q", got)
			}
			for name, want := range map[string]string{"event-id": "poison-1", "tenant": "acme"} {
				if got := aws.ToString(dl.MessageAttributes[name].StringValue); got != want {
					t.Errorf("attribute %s = %q, want %q", name, got, want)
				}
			}
			meta, err := sqsdedup.DeadLetterMetadata(dl)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]string{
				"dedup-reason": "handler-error", "dedup-attempts": "3", "dedup-event-id": "poison-1",
				"dedup-scope": scope, "dedup-cause": "cannot handle this", "dedup-origin-queue": url,
				"dedup-cause-type": "*errors.errorString",
			}
			for k, v := range want {
				if meta[k] != v {
					t.Errorf("%s = %q, want %q", k, meta[k], v)
				}
			}
			if meta["dedup-origin-message-id"] == "" || meta["dedup-first-failure"] == "" {
				t.Errorf("metadata lacks origin message ID or failure time: %v", meta)
			}
			assertDrained(t, c, url)
		})
	}
}

// SQS's own receive count counts toward MaxAttempts: a message already
// received three times (by a consumer that crashed before recording
// anything) is dead-lettered after its first failed attempt here.
func TestReceiveCountCountsAsAttempts(t *testing.T) {
	t.Parallel()
	c := client(t)
	url := queue(t, c)
	rec := adaptertest.NewEffects()
	sink := dedup.NewMemorySink()
	w := wrap(t, dedup.NewMemoryStore(), url, rec, func(ctx context.Context, m types.Message) error {
		rec.Call(eventID(m))
		return errors.New("still failing")
	}, dedup.WithMaxAttempts(4), dedup.WithSink(sink))
	send(t, c, url, "counted-1", "x", nil)
	for range 3 {
		msgs := receive(t, c, url, time.Second)
		if len(msgs) != 1 {
			t.Fatalf("received %d messages, want 1", len(msgs))
		}
		if _, err := c.ChangeMessageVisibility(context.Background(), &sqs.ChangeMessageVisibilityInput{
			QueueUrl: aws.String(url), ReceiptHandle: msgs[0].ReceiptHandle, VisibilityTimeout: 0,
		}); err != nil {
			t.Fatal(err)
		}
	}
	stop := start(t, c, url, w)
	adaptertest.WaitFor(t, 10*time.Second, "the message dead-lettered", func() bool { return rec.Outcomes(dedup.OutcomeDeadLettered) == 1 })
	stop()
	if n := len(rec.CallOrder()); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	if letters := sink.Letters(); len(letters) != 1 || letters[0].Attempts != 4 {
		t.Errorf("dead letters %+v, want one with 4 attempts", letters)
	}
	assertDrained(t, c, url)
}

// An endpoint that returns no ApproximateReceiveCount (here: the client's
// middleware removes it from every received message) is said once in the log,
// and the store's count of attempts takes its place: the message is still
// dead-lettered after WithMaxAttempts attempts.
func TestMissingReceiveCountFallsBackToStore(t *testing.T) {
	t.Parallel()
	c := client(t, stripReceiveCount)
	url := queue(t, c)
	rec := adaptertest.NewEffects()
	sink := dedup.NewMemorySink()
	w := wrap(t, dedup.NewMemoryStore(), url, rec, func(ctx context.Context, m types.Message) error {
		rec.Call(eventID(m))
		return errors.New("still failing")
	}, dedup.WithMaxAttempts(3), dedup.WithSink(sink))
	send(t, c, url, "uncounted-1", "x", nil)
	logs := &testenv.Logs{}
	stop := start(t, c, url, w, sqsdedup.WithLogger(slog.New(logs)))
	adaptertest.WaitFor(t, 20*time.Second, "the message dead-lettered", func() bool { return rec.Outcomes(dedup.OutcomeDeadLettered) == 1 })
	stop()
	if n := len(rec.CallOrder()); n != 3 {
		t.Errorf("handler ran %d times, want 3", n)
	}
	if letters := sink.Letters(); len(letters) != 1 || letters[0].Attempts != 3 {
		t.Errorf("dead letters %+v, want one with 3 attempts", letters)
	}
	if n := logs.Count(slog.LevelWarn, "no ApproximateReceiveCount"); n != 1 {
		t.Errorf("%d warnings of the missing receive count, want 1; logs:\n%s", n, logs)
	}
	assertDrained(t, c, url)
}

// stripReceiveCount is a client middleware that removes the
// ApproximateReceiveCount from received messages, as some SQS-compatible
// endpoints do.
func stripReceiveCount(stack *middleware.Stack) error {
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("stripReceiveCount",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			out, md, err := next.HandleInitialize(ctx, in)
			if r, ok := out.Result.(*sqs.ReceiveMessageOutput); ok {
				for _, m := range r.Messages {
					delete(m.Attributes, string(types.MessageSystemAttributeNameApproximateReceiveCount))
				}
			}
			return out, md, err
		}), middleware.After)
}

// When the DLQ cannot be written, the original stays in its queue; once the
// DLQ works again, the message is parked and deleted.
func TestFailingDeadLetterKeepsOriginal(t *testing.T) {
	t.Parallel()
	noSend := awsfault.Fail(errInjected, "SendMessage")
	c := client(t)
	url := queue(t, c)
	dlq := queue(t, c)
	rec := adaptertest.NewEffects()
	w := wrap(t, dedup.NewMemoryStore(), url, rec, func(ctx context.Context, m types.Message) error {
		rec.Call(eventID(m))
		return dedup.Permanent(errors.New("malformed order"))
	}, dedup.WithSink(newSink(t, client(t, noSend.APIOption), dlq)))
	send(t, c, url, "bad-1", "x", nil)
	noSend.On()
	stop := start(t, c, url, w)
	adaptertest.WaitFor(t, 10*time.Second, "a dead letter refused", func() bool { return noSend.Hits() > 0 })
	if msgs := receive(t, c, dlq, 0); len(msgs) != 0 {
		t.Fatalf("DLQ holds %d messages, want 0", len(msgs))
	}
	noSend.Off()
	// The message comes back only if it was not deleted.
	adaptertest.WaitFor(t, 10*time.Second, "the message dead-lettered", func() bool { return rec.Outcomes(dedup.OutcomeDeadLettered) == 1 })
	stop()
	letters := receive(t, c, dlq, time.Second)
	if len(letters) != 1 {
		t.Fatalf("DLQ holds %d messages, want 1", len(letters))
	}
	if meta, _ := sqsdedup.DeadLetterMetadata(letters[0]); meta["dedup-reason"] != "permanent" {
		t.Errorf("dead letter metadata %v, want reason permanent", meta)
	}
	assertDrained(t, c, url)
}

// Deletes that fail, as a whole call or entry by entry behind a success, are
// retried until they succeed: no message comes back.
func TestFailedDeletesAreRetried(t *testing.T) {
	t.Parallel()
	whole := awsfault.Fail(errInjected, "DeleteMessageBatch")
	entry := &failFirstEntry{}
	for _, tc := range []struct {
		name  string
		fault func(*middleware.Stack) error
		on    func(n int)
		hits  func() int
	}{
		{"whole call", whole.APIOption, whole.Times, whole.Hits},
		{"per entry", entry.APIOption, entry.times, entry.hits},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := client(t, tc.fault)
			url := queue(t, c)
			rec := adaptertest.NewEffects()
			w := wrap(t, dedup.NewMemoryStore(), url, rec, func(ctx context.Context, m types.Message) error {
				rec.Apply(eventID(m))
				return nil
			})
			for i := range 3 {
				send(t, c, url, "del-"+strconv.Itoa(i), "x", nil)
			}
			tc.on(2)
			stop := start(t, c, url, w, sqsdedup.WithDeleteInterval(300*time.Millisecond))
			adaptertest.WaitFor(t, 10*time.Second, "all processed and the faults used", func() bool {
				return rec.Outcomes(dedup.OutcomeProcessed) == 3 && tc.hits() == 2
			})
			assertDrained(t, c, url)
			stop()
			if n := rec.Results(); n != 3 {
				t.Errorf("%d deliveries, want 3: a message whose delete failed came back", n)
			}
		})
	}
}

// On a FIFO queue, each group's messages are handled in order, a failed
// message holding back the rest of its group until it succeeds. The event ID
// is the MessageDeduplicationId.
func TestFIFOOrder(t *testing.T) {
	t.Parallel()
	c := client(t)
	url := fifoQueue(t, c)
	rec := adaptertest.NewEffects()
	failedOnce := false
	w := wrap(t, dedup.NewMemoryStore(), url, rec, func(ctx context.Context, m types.Message) error {
		id := eventID(m)
		rec.Call(id)
		if id == "A2" && !failedOnce {
			failedOnce = true
			return errors.New("first try fails")
		}
		rec.Apply(id)
		return nil
	}, dedup.WithBackoff(func(int) time.Duration { return time.Second }))
	var want = map[string][]string{"A": nil, "B": nil}
	for i := 1; i <= 4; i++ {
		for _, g := range []string{"A", "B"} {
			id := g + strconv.Itoa(i)
			want[g] = append(want[g], id)
			_, err := c.SendMessage(context.Background(), &sqs.SendMessageInput{
				QueueUrl: aws.String(url), MessageBody: aws.String(id),
				MessageGroupId: aws.String(g), MessageDeduplicationId: aws.String(id),
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	stop := start(t, c, url, w)
	adaptertest.WaitFor(t, 20*time.Second, "all processed", func() bool { return rec.Outcomes(dedup.OutcomeProcessed) == 8 })
	stop()
	got := map[string][]string{}
	for _, id := range rec.CallOrder() {
		got[id[:1]] = append(got[id[:1]], id)
	}
	wantA := []string{"A1", "A2", "A2", "A3", "A4"}
	if fmt.Sprint(got["A"]) != fmt.Sprint(wantA) || fmt.Sprint(got["B"]) != fmt.Sprint(want["B"]) {
		t.Errorf("handler calls by group %v, want A %v and B %v", got, wantA, want["B"])
	}
	assertDrained(t, c, url)
}

// Cancelling Run lets the running handler finish, deletes its message, and
// leaves no goroutine behind.
func TestShutdownFinishesWorkAndLeaksNothing(t *testing.T) {
	defer goleak.VerifyNone(t, append(ignoreHTTP, goleak.IgnoreCurrent())...)
	c := client(t)
	url := queue(t, c)
	rec := adaptertest.NewEffects()
	started := make(chan struct{}, 1)
	w := wrap(t, dedup.NewMemoryStore(), url, rec, func(ctx context.Context, m types.Message) error {
		started <- struct{}{}
		time.Sleep(time.Second)
		rec.Apply(eventID(m))
		return nil
	})
	send(t, c, url, "shutdown-1", "x", nil)
	stop := start(t, c, url, w, sqsdedup.WithPollers(3))
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("handler never started")
	}
	begin := time.Now()
	stop()
	if d := time.Since(begin); d > 5*time.Second {
		t.Errorf("Run took %v to return", d)
	}
	if rec.Outcomes(dedup.OutcomeProcessed) != 1 || rec.Count("shutdown-1") != 1 {
		t.Errorf("the running handler did not finish: %d processed", rec.Outcomes(dedup.OutcomeProcessed))
	}
	assertDrained(t, c, url)
}

// A handler that outlives the shutdown timeout gets its context cancelled;
// its message is given back at once and handled by the next consumer.
func TestShutdownTimeoutGivesMessageBack(t *testing.T) {
	t.Parallel()

	c := client(t)
	url := testenv.SQSQueue(t, c, map[string]string{"VisibilityTimeout": "30"})
	rec := adaptertest.NewEffects()
	store := dedup.NewMemoryStore()
	scope := dedup.WithScope(uniqueScope())
	slow := wrap(t, store, url, rec, func(ctx context.Context, m types.Message) error {
		rec.Call(eventID(m))
		<-ctx.Done()
		return ctx.Err()
	}, scope)
	send(t, c, url, "stuck-1", "x", nil)
	stop := start(t, c, url, slow, sqsdedup.WithShutdownTimeout(200*time.Millisecond))
	adaptertest.WaitFor(t, 10*time.Second, "the handler started", func() bool { return len(rec.CallOrder()) == 1 })
	stop()

	fast := wrap(t, store, url, rec, func(ctx context.Context, m types.Message) error {
		rec.Apply(eventID(m))
		return nil
	}, scope)
	stop = start(t, c, url, fast)
	// Well before the queue's 30 s visibility timeout.
	adaptertest.WaitFor(t, 5*time.Second, "the message handled again", func() bool { return rec.Count("stuck-1") == 1 })
	stop()
}

// NewConsumer rejects what Run could not work with, naming it, without
// contacting SQS (the client here has no endpoint).
func TestNewConsumerRejectsBadConfig(t *testing.T) {
	c := sqs.New(sqs.Options{Region: "us-east-1"})
	const url = "https://sqs.us-east-1.amazonaws.com/123456789012/orders"
	w := wrap(t, dedup.NewMemoryStore(), url, adaptertest.NewEffects(), func(context.Context, types.Message) error { return nil })
	for _, tc := range []struct {
		client *sqs.Client
		url    string
		w      *dedup.Wrapper[types.Message]
		opt    sqsdedup.Opt
		names  string
	}{
		{nil, url, w, nil, "nil SQS client"},
		{c, "", w, nil, "empty queue URL"},
		{c, "orders", w, nil, `"orders"`},
		{c, "https://sqs.us-east-1.amazonaws.com/", w, nil, "queue path"},
		{c, url, nil, nil, "nil wrapper"},
		{c, url, w, sqsdedup.WithPollers(0), "WithPollers"},
		{c, url, w, sqsdedup.WithWorkers(0), "WithWorkers"},
		{c, url, w, sqsdedup.WithMaxMessages(11), "WithMaxMessages"},
		{c, url, w, sqsdedup.WithWaitTime(21 * time.Second), "WithWaitTime"},
		{c, url, w, sqsdedup.WithVisibilityTimeout(13 * time.Hour), "WithVisibilityTimeout"},
		{c, url, w, sqsdedup.WithLogger(nil), "WithLogger"},
	} {
		var opts []sqsdedup.Opt
		if tc.opt != nil {
			opts = append(opts, tc.opt)
		}
		if _, err := sqsdedup.NewConsumer(tc.client, tc.url, tc.w, opts...); !errors.Is(err, dedup.ErrConfig) || !strings.Contains(err.Error(), tc.names) {
			t.Errorf("NewConsumer: %v, want ErrConfig naming %s", err, tc.names)
		}
	}
}

// Run fails at once when the queue does not exist.
func TestRunFailsForMissingQueue(t *testing.T) {
	c := testenv.SQS(t)
	url := queue(t, c) + "-missing"
	w := wrap(t, dedup.NewMemoryStore(), url, adaptertest.NewEffects(), func(context.Context, types.Message) error { return nil })
	consumer, err := sqsdedup.NewConsumer(c, url, w)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var missing *types.QueueDoesNotExist
	if err := consumer.Run(ctx); !errors.As(err, &missing) {
		t.Errorf("Run: %v, want QueueDoesNotExist", err)
	}
}

// A copy of an event that is being handled elsewhere is neither deleted nor
// kept invisible: it comes back after the short in-flight delay, again and
// again, until the first copy has settled; then it is deleted as a
// duplicate.
func TestInFlightCopyComesBack(t *testing.T) {
	t.Parallel()
	c := client(t)
	url := queue(t, c)
	rec := adaptertest.NewEffects()
	started, release := make(chan struct{}, 1), make(chan struct{})
	w := wrap(t, dedup.NewMemoryStore(), url, rec, func(ctx context.Context, m types.Message) error {
		started <- struct{}{}
		<-release
		rec.Apply(eventID(m))
		return nil
	})
	send(t, c, url, "evt-1", "x", nil)
	stop := start(t, c, url, w)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the first copy never started")
	}
	send(t, c, url, "evt-1", "x", nil)
	adaptertest.WaitFor(t, 10*time.Second, "the copy seen in flight twice", func() bool { return rec.Outcomes(dedup.OutcomeInFlight) >= 2 })
	close(release)
	adaptertest.WaitFor(t, 10*time.Second, "both copies settled", func() bool {
		return rec.Outcomes(dedup.OutcomeProcessed) == 1 && rec.Outcomes(dedup.OutcomeDuplicate) == 1
	})
	stop()
	if n := rec.Count("evt-1"); n != 1 {
		t.Errorf("%d effects, want 1", n)
	}
	assertDrained(t, c, url)
}

// A message being deleted is no longer extended by the heartbeat: an
// extension racing with the delete was refused for a message already gone,
// and warned that a settled message might be delivered again.
func TestHeartbeatLeavesDeletedMessagesAlone(t *testing.T) {
	t.Parallel()
	// The deletes' responses arrive 1.5 s late: two heartbeats of a 2 s
	// visibility timeout run meanwhile.
	c := client(t, slowResponse("DeleteMessageBatch", 1500*time.Millisecond))
	url := queue(t, c)
	rec := adaptertest.NewEffects()
	w := wrap(t, dedup.NewMemoryStore(), url, rec, func(ctx context.Context, m types.Message) error {
		rec.Apply(eventID(m))
		return nil
	})
	for i := range 3 {
		send(t, c, url, "beat-"+strconv.Itoa(i), "x", nil)
	}
	var logs logBuffer
	stop := start(t, c, url, w, sqsdedup.WithLogger(logs.logger()))
	adaptertest.WaitFor(t, 10*time.Second, "all processed", func() bool { return rec.Outcomes(dedup.OutcomeProcessed) == 3 })
	assertDrained(t, c, url)
	stop()
	if strings.Contains(logs.String(), "visibility") {
		t.Errorf("the heartbeat extended messages being deleted:\n%s", logs.String())
	}
}

// A consumer stopped before Run could read the queue's visibility timeout
// returns nil, as any stop does.
func TestRunStoppedBeforeStart(t *testing.T) {
	c := testenv.SQS(t)
	url := queue(t, c)
	w := wrap(t, dedup.NewMemoryStore(), url, adaptertest.NewEffects(), func(context.Context, types.Message) error { return nil })
	consumer, err := sqsdedup.NewConsumer(c, url, w)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := consumer.Run(ctx); err != nil {
		t.Errorf("Run with its context done: %v, want nil", err)
	}
}

// A wrapper without WithLease leases each message for the queue's
// visibility timeout, which the consumer passes with dedup.CallLease: a
// standard queue's messages (HandleConcurrent) and a FIFO group's
// (HandleBatch) alike.
func TestLeaseIsTheVisibilityTimeout(t *testing.T) {
	c := client(t)
	for name, url := range map[string]string{
		"standard": testenv.SQSQueue(t, c, map[string]string{"VisibilityTimeout": "45"}),
		"fifo":     testenv.SQSQueue(t, c, map[string]string{"VisibilityTimeout": "45", "FifoQueue": "true"}),
	} {
		t.Run(name, func(t *testing.T) {
			store, scope := dedup.NewMemoryStore(), uniqueScope()
			leases := make(chan time.Duration, 1)
			w, err := dedup.Wrap(store, sqsdedup.Messages(url), func(ctx context.Context, m types.Message) error {
				rec, err := store.Get(ctx, dedup.Key{Scope: scope, EventID: eventID(m)})
				if err == nil {
					leases <- time.Until(rec.LeaseUntil)
				}
				return err
			}, dedup.WithScope(scope), dedup.WithSink(dedup.NewMemorySink()))
			if err != nil {
				t.Fatal(err)
			}
			in := &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String("x"),
				MessageAttributes: map[string]types.MessageAttributeValue{"event-id": stringAttr("lease-1")}}
			if name == "fifo" {
				in.MessageGroupId, in.MessageDeduplicationId = aws.String("g"), aws.String("lease-1")
			}
			if _, err := c.SendMessage(context.Background(), in); err != nil {
				t.Fatal(err)
			}
			stop := start(t, c, url, w)
			defer stop()
			select {
			case lease := <-leases:
				if lease < 35*time.Second || lease > 45*time.Second {
					t.Errorf("leased for %v, want the visibility timeout, 45 s", lease)
				}
			case <-time.After(60 * time.Second):
				t.Fatal("the message was never handled")
			}
		})
	}
}
