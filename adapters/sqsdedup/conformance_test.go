package sqsdedup_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/awsfault"
)

// The consumer passes the adapter conformance suite on the SQS endpoint
// (fauxqs by default; see testenv.SQS for another emulator and what it
// cannot pass): a standard queue with a 2 s visibility timeout shared by
// the consumers, a queue of its own as the dead-letter destination, and a
// middleware fault failing every call of the consumers' client as a broken
// connection.
func TestConformance(t *testing.T) {
	adaptertest.Run(t, sqsFeatures, newSQSHarness(rawDelivery))
}

// sqsFeatures: the SDK's HTTP transport keeps idle connections, each with
// two goroutines, after a call.
var sqsFeatures = adaptertest.Features{
	IgnoreGoroutines: []string{"net/http.(*persistConn).readLoop", "net/http.(*persistConn).writeLoop"},
}

// sqsHarness is the suite's view of one queue and its dead-letter queue.
type sqsHarness struct {
	client   *sqs.Client // publishing, reading back, the sink's
	consumed *sqs.Client // the consumers', through fault
	fault    *awsfault.Fault
	url, dlq string
	sink     *sqsdedup.Sink
	delivery delivery

	mu      sync.Mutex
	seen    map[string]bool // dead letters read, by message ID
	letters []adaptertest.Letter
}

var errBroken = errors.New("connection broken by the test")

// delivery is how the suite's messages reach the harness's queue: sent
// as they are, or wrapped in an envelope by SNS or EventBridge.
type delivery struct {
	// opts are the consumer's Messages options reading the envelope.
	opts []sqsdedup.MessagesOpt
	// body returns the body a message arrives with, and its message
	// attributes.
	body func(t *testing.T, m adaptertest.Message) (string, map[string]types.MessageAttributeValue)
	// read returns the suite's message from one the handler gets.
	read func(types.Message) adaptertest.Message
	// payload returns the suite's payload from a letter's body, the body
	// the original arrived with.
	payload func(t *testing.T, body string) []byte
}

// rawDelivery sends each message's payload as the body, with its ID in
// the event-id attribute and its headers as attributes.
var rawDelivery = delivery{
	body: func(_ *testing.T, m adaptertest.Message) (string, map[string]types.MessageAttributeValue) {
		attrs := map[string]types.MessageAttributeValue{sqsdedup.DefaultIDAttribute: stringAttr(m.ID)}
		for k, v := range m.Headers {
			attrs[k] = stringAttr(v)
		}
		return string(m.Payload), attrs
	},
	read: func(m types.Message) adaptertest.Message {
		msg := adaptertest.Message{ID: eventID(m), Payload: []byte(aws.ToString(m.Body)), Headers: map[string]string{}}
		for k, v := range m.MessageAttributes {
			if k != sqsdedup.DefaultIDAttribute {
				msg.Headers[k] = aws.ToString(v.StringValue)
			}
		}
		return msg
	},
	payload: func(_ *testing.T, body string) []byte { return []byte(body) },
}

// newSQSHarness returns the constructor of harnesses whose messages arrive
// by d.
func newSQSHarness(d delivery) func(t *testing.T) adaptertest.Harness {
	return func(t *testing.T) adaptertest.Harness {
		c := client(t)
		fault := awsfault.Fail(errBroken)
		h := &sqsHarness{
			client:   c,
			consumed: sqs.New(c.Options(), func(o *sqs.Options) { o.APIOptions = append(o.APIOptions, fault.APIOption) }),
			fault:    fault, url: queue(t, c), dlq: queue(t, c), seen: map[string]bool{}, delivery: d,
		}
		h.sink = newSink(t, c, h.dlq)
		return h
	}
}

// Publish sends each message as its delivery has it arrive.
func (h *sqsHarness) Publish(t *testing.T, msgs ...adaptertest.Message) {
	t.Helper()
	for _, m := range msgs {
		body, attrs := h.delivery.body(t, m)
		in := &sqs.SendMessageInput{QueueUrl: aws.String(h.url), MessageBody: aws.String(body)}
		if len(attrs) > 0 {
			in.MessageAttributes = attrs
		}
		if _, err := h.client.SendMessage(context.Background(), in); err != nil {
			t.Fatalf("send to %s: %v", h.url, err)
		}
	}
}

func (h *sqsHarness) NewConsumer(t *testing.T, cfg adaptertest.Config) adaptertest.Consumer {
	t.Helper()
	w := adaptertest.Wrap(t, cfg, sqsdedup.Messages(h.url, h.delivery.opts...), h.sink, h.delivery.read)
	c, err := sqsdedup.NewConsumer(h.consumed, h.url, w, sqsdedup.WithWaitTime(time.Second),
		sqsdedup.WithInFlightDelay(time.Second), sqsdedup.WithShutdownTimeout(cfg.ShutdownTimeout),
		sqsdedup.WithLogger(adaptertest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// DeadLetters receives and deletes what reached the dead-letter queue since
// the last call and returns every letter so far.
func (h *sqsHarness) DeadLetters(t *testing.T) []adaptertest.Letter {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range receive(t, h.client, h.dlq, 0) {
		deleteMessage(t, h.client, h.dlq, m)
		if h.seen[aws.ToString(m.MessageId)] {
			continue
		}
		h.seen[aws.ToString(m.MessageId)] = true
		meta, err := sqsdedup.DeadLetterMetadata(m)
		if err != nil {
			t.Fatal(err)
		}
		attempts, _ := strconv.Atoi(meta["dedup-attempts"])
		h.letters = append(h.letters, adaptertest.Letter{EventID: meta["dedup-event-id"],
			Reason: dedup.Reason(meta["dedup-reason"]), Attempts: attempts, Payload: h.delivery.payload(t, aws.ToString(m.Body)), Metadata: meta})
	}
	return append([]adaptertest.Letter(nil), h.letters...)
}

// Unsettled counts the queue's messages, visible, in flight or delayed.
func (h *sqsHarness) Unsettled(t *testing.T) int {
	t.Helper()
	out, err := h.client.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(h.url),
		AttributeNames: []types.QueueAttributeName{
			types.QueueAttributeNameApproximateNumberOfMessages,
			types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
			types.QueueAttributeNameApproximateNumberOfMessagesDelayed,
		},
	})
	if err != nil {
		t.Fatalf("queue attributes of %s: %v", h.url, err)
	}
	n := 0
	for _, v := range out.Attributes {
		c, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("queue attribute %q: %v", v, err)
		}
		n += c
	}
	return n
}

// BreakConnection fails every call of the consumers' client until
// restored.
func (h *sqsHarness) BreakConnection(t *testing.T) (restore func()) {
	t.Helper()
	h.fault.On()
	adaptertest.WaitFor(t, adaptertest.Deadline, "a call of the consumer failed", func() bool { return h.fault.Hits() > 0 })
	return h.fault.Off
}
