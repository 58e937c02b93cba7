package sqsdedup_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/awsfault"
	"github.com/dedupkit/dedup/internal/testenv"
)

// failingStore returns a DynamoDB store whose every call fails while the
// returned fault is on (it starts off).
func failingStore(t *testing.T) (dedup.Store, *awsfault.Fault) {
	t.Helper()
	plain := testenv.DynamoDB(t)
	table := tableName("sqsdedup-outage-")
	if err := dedup.CreateDynamoDBTable(context.Background(), plain, dedup.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := plain.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)}); err != nil {
			t.Errorf("delete table %s: %v", table, err)
		}
	})
	fault := awsfault.Fail(errInjected)
	client := dynamodb.New(plain.Options(), func(o *dynamodb.Options) {
		o.APIOptions = append(o.APIOptions, fault.APIOption)
		o.RetryMaxAttempts = 1
	})
	s, err := dedup.NewDynamoDBStore(client, dedup.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	return s, fault
}

// With the store down, the consumer is not silent: each unacknowledged
// message is a warning until the failures have lasted WithOutageThreshold;
// then the outage is an ERROR from the wrapper, reminded by the consumer
// each threshold (not one per message), Health reports it and Stats says
// since when; once the store answers again, the messages are processed, the
// wrapper logs the end of the outage and Health is nil again.
func TestOutageIsLoggedAndReported(t *testing.T) {
	t.Parallel()
	c := client(t)
	url := testenv.SQSQueue(t, c, map[string]string{"VisibilityTimeout": "1"})
	store, fault := failingStore(t)
	rec := adaptertest.NewEffects()
	logs := &testenv.Logs{}
	w := wrap(t, store, url, rec, func(ctx context.Context, m types.Message) error {
		rec.Apply(eventID(m))
		return nil
	}, dedup.WithLogger(slog.New(logs)), dedup.WithOutageThreshold(time.Second))
	for _, id := range []string{"o-1", "o-2", "o-3"} {
		send(t, c, url, id, "x", nil)
	}
	fault.On()
	consumer, err := sqsdedup.NewConsumer(c, url, w, sqsdedup.WithWaitTime(time.Second),
		sqsdedup.WithLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	if err := consumer.Health(); err != nil {
		t.Errorf("Health before any message: %v, want nil", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- consumer.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	const notAcked = "message not acknowledged"
	adaptertest.WaitFor(t, 30*time.Second, "an outage reminded at ERROR and many failures", func() bool {
		return logs.Count(slog.LevelError, "dedup: store or dead-letter sink still failing") >= 1 &&
			logs.Count(slog.LevelWarn, notAcked)+logs.Count(slog.LevelDebug, notAcked) >= 9
	})
	failures := logs.Count(slog.LevelWarn, notAcked) + logs.Count(slog.LevelDebug, notAcked)
	if n := logs.Count(slog.LevelError, "dedup: the store or dead-letter sink has been failing"); n != 1 {
		t.Errorf("%d ERROR records of the outage's start, want 1", n)
	}
	if errs := logs.Count(slog.LevelError, ""); errs >= failures/2 {
		t.Errorf("%d ERROR records for %d failures, want the outage reported, not each message", errs, failures)
	}
	herr := consumer.Health()
	if !errors.Is(herr, sqsdedup.ErrOutage) || !errors.Is(herr, errInjected) {
		t.Errorf("Health during the outage: %v, want ErrOutage wrapping the store's error", herr)
	}
	st := consumer.Stats()
	if st.FailingSince.IsZero() || !st.LastSuccess.IsZero() || !errors.Is(st.LastError, errInjected) {
		t.Errorf("Stats during the outage: %+v", st)
	}
	if n := rec.Count("o-1") + rec.Count("o-2") + rec.Count("o-3"); n != 0 {
		t.Errorf("%d effects with the store down", n)
	}

	fault.Off()
	adaptertest.WaitFor(t, 30*time.Second, "every message processed", func() bool { return rec.Outcomes(dedup.OutcomeProcessed) == 3 })
	if err := consumer.Health(); err != nil {
		t.Errorf("Health after the outage: %v, want nil", err)
	}
	if st := consumer.Stats(); !st.FailingSince.IsZero() || st.LastSuccess.IsZero() {
		t.Errorf("Stats after the outage: %+v", st)
	}
	if n := logs.Count(slog.LevelInfo, "recorded again after an outage"); n != 1 {
		t.Errorf("%d INFO records of the outage's end, want 1; logs:\n%s", n, logs)
	}
}

// With WithMaxOutage, Run gives up once the store has been failing that long:
// it shuts down by itself and returns an error matching ErrOutage, leaving
// the message in its queue.
func TestMaxOutageStopsRun(t *testing.T) {
	t.Parallel()
	c := client(t)
	url := testenv.SQSQueue(t, c, map[string]string{"VisibilityTimeout": "1"})
	store, fault := failingStore(t)
	rec := adaptertest.NewEffects()
	w := wrap(t, store, url, rec, func(ctx context.Context, m types.Message) error { return nil })
	send(t, c, url, "m-1", "x", nil)
	fault.On()
	consumer, err := sqsdedup.NewConsumer(c, url, w, sqsdedup.WithWaitTime(time.Second),
		sqsdedup.WithMaxOutage(2*time.Second), sqsdedup.WithLogger(adaptertest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err = consumer.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("Run returned only when its context ended: %v", err)
	}
	if !errors.Is(err, sqsdedup.ErrOutage) || !errors.Is(err, errInjected) {
		t.Errorf("Run: %v, want ErrOutage wrapping the store's error", err)
	}
	// local-aws-sqs may return one message several times in a receive.
	msgs := receive(t, c, url, 5*time.Second)
	for _, m := range msgs {
		if eventID(m) != "m-1" {
			t.Errorf("received %s, want only m-1", eventID(m))
		}
	}
	if len(msgs) == 0 {
		t.Error("m-1 is not in the queue after Run gave up")
	}
}
