package sqsdedup_test

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"log/slog"
	"strings"
	"sync"
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
	"github.com/dedupkit/dedup/internal/sqsbody"
	"github.com/dedupkit/dedup/internal/testenv"
)

// The SDK's HTTP transport keeps idle connections, each with two goroutines.
var ignoreHTTP = []goleak.Option{
	goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
	goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
}

func TestMain(m *testing.M) {
	// These tests spend their time waiting for visibility timeouts, not on
	// the CPU: unless -test.parallel says otherwise, run more of them at once
	// than the default of one per CPU.
	flag.Parse()
	parallel := false
	flag.Visit(func(f *flag.Flag) { parallel = parallel || f.Name == "test.parallel" })
	if !parallel {
		_ = flag.Set("test.parallel", "8")
	}
	goleak.VerifyTestMain(m, ignoreHTTP...)
}

// errInjected is what injected faults fail with.
var errInjected = errors.New("injected fault")

// client returns an SQS client for the test endpoint, with extra API options.
func client(t *testing.T, apiOptions ...func(*middleware.Stack) error) *sqs.Client {
	base := testenv.SQS(t)
	if len(apiOptions) == 0 {
		return base
	}
	return sqs.New(base.Options(), func(o *sqs.Options) { o.APIOptions = append(o.APIOptions, apiOptions...) })
}

// queue creates a standard queue with a 2 s visibility timeout.
func queue(t *testing.T, c *sqs.Client) string {
	return testenv.SQSQueue(t, c, map[string]string{"VisibilityTimeout": "2"})
}

func fifoQueue(t *testing.T, c *sqs.Client) string {
	return testenv.SQSQueue(t, c, map[string]string{"VisibilityTimeout": "2", "FifoQueue": "true"})
}

func uniqueScope() string { return "sqs-test-" + strings.ToLower(rand.Text()[:10]) }

func stringAttr(v string) types.MessageAttributeValue {
	return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
}

// send sends body with the event-id attribute and extra attributes.
func send(t *testing.T, c *sqs.Client, url, eventID, body string, extra map[string]types.MessageAttributeValue) {
	t.Helper()
	attrs := map[string]types.MessageAttributeValue{"event-id": stringAttr(eventID)}
	for k, v := range extra {
		attrs[k] = v
	}
	_, err := c.SendMessage(context.Background(), &sqs.SendMessageInput{
		QueueUrl: aws.String(url), MessageBody: aws.String(body), MessageAttributes: attrs,
	})
	if err != nil {
		t.Fatalf("send %s: %v", eventID, err)
	}
}

// receive receives up to 10 messages from url, waiting up to wait.
func receive(t *testing.T, c *sqs.Client, url string, wait time.Duration) []types.Message {
	t.Helper()
	out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
		QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: int32(wait / time.Second),
		MessageAttributeNames:       []string{"All"},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		//lint:ignore SA1019 some SQS-compatible endpoints read only the older parameter
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll},
	}, sqsbody.KeepConnection)
	if err != nil {
		t.Fatalf("receive from %s: %v", url, err)
	}
	return out.Messages
}

// assertDrained fails t unless every message of url is deleted: none
// visible, none in flight. SQS's counts are approximate but lag only behind
// changes, and before the deletes they were not zero.
func assertDrained(t *testing.T, c *sqs.Client, url string) {
	t.Helper()
	var counts map[string]string
	deadline := time.Now().Add(90 * time.Second) // real SQS updates its counts within a minute
	for time.Now().Before(deadline) {
		out, err := c.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{
			QueueUrl: aws.String(url),
			AttributeNames: []types.QueueAttributeName{
				types.QueueAttributeNameApproximateNumberOfMessages,
				types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
				types.QueueAttributeNameApproximateNumberOfMessagesDelayed,
			},
		})
		if err != nil {
			t.Fatalf("queue attributes of %s: %v", url, err)
		}
		counts = out.Attributes
		if counts["ApproximateNumberOfMessages"] == "0" && counts["ApproximateNumberOfMessagesNotVisible"] == "0" &&
			counts["ApproximateNumberOfMessagesDelayed"] == "0" {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Errorf("%s still holds messages: %v", url, counts)
}

// eventID reads a message's event ID the way the consumer does.
func eventID(m types.Message) string {
	id, _ := sqsdedup.Messages("").EventID(m)
	return id
}

// wrap returns a wrapper over store for url's messages with test defaults
// (unique scope, memory sink, 2 s lease, no backoff); opts come after them.
func wrap(t *testing.T, store dedup.Store, url string, rec *adaptertest.Effects, h dedup.Handler[types.Message], opts ...dedup.Opt) *dedup.Wrapper[types.Message] {
	t.Helper()
	base := []dedup.Opt{
		dedup.WithScope(uniqueScope()),
		dedup.WithSink(dedup.NewMemorySink()),
		dedup.WithLease(2 * time.Second),
		dedup.WithBackoff(func(int) time.Duration { return 0 }),
		dedup.WithObserver(rec.Observe),
	}
	w, err := dedup.Wrap(store, sqsdedup.Messages(url), h, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// start runs a consumer of url until the returned stop is called (or the
// test ends); stop waits for Run to return nil.
func start(t *testing.T, c *sqs.Client, url string, w *dedup.Wrapper[types.Message], opts ...sqsdedup.Opt) (stop func()) {
	t.Helper()
	base := []sqsdedup.Opt{sqsdedup.WithWaitTime(time.Second), sqsdedup.WithInFlightDelay(time.Second), sqsdedup.WithLogger(adaptertest.Logger(t))}
	consumer, err := sqsdedup.NewConsumer(c, url, w, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	run := adaptertest.Start(t, consumer.Run)
	stop = func() { run.StopClean(t) }
	t.Cleanup(stop)
	return stop
}

// logBuffer keeps what a logger writes, for tests that check the logs.
type logBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// logger returns a logger of warnings and errors to b.
func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func deleteMessage(t *testing.T, c *sqs.Client, url string, m types.Message) {
	t.Helper()
	if _, err := c.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle}); err != nil {
		t.Fatal(err)
	}
}

func newSink(t *testing.T, c *sqs.Client, url string, opts ...sqsdedup.SinkOpt) *sqsdedup.Sink {
	t.Helper()
	s, err := sqsdedup.NewSink(c, url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
