package sqsdedup_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/internal/testenv"
)

// letter returns a dead letter as the wrapper hands it to a sink, with n
// original attributes.
func letter(n int) dedup.DeadLetter {
	dl := dedup.DeadLetter{
		Payload: []byte("payload"),
		Origin:  dedup.Origin{QueueURL: "https://sqs/orders", MessageID: "msg-1"},
		Reason:  dedup.ReasonHandlerError, Error: "attempt 3: boom", Cause: "boom",
		ErrorType: "*fmt.wrapError", CauseType: "*errors.errorString",
		Attempts: 3, EventID: "evt-1", Scope: "orders",
		FirstFailure: time.Now().Add(-time.Minute), LastFailure: time.Now(),
	}
	for i := range n {
		dl.Headers = append(dl.Headers, dedup.Header{Key: fmt.Sprintf("attr-%d", i), Value: []byte(fmt.Sprintf("value %d", i))})
	}
	return dl
}

// sendAndReceive sends dl through a sink to a new queue and receives it.
func sendAndReceive(t *testing.T, dl dedup.DeadLetter, opts ...sqsdedup.SinkOpt) types.Message {
	t.Helper()
	c := client(t)
	dlq := queue(t, c)
	if err := newSink(t, c, dlq, opts...).Send(context.Background(), dl); err != nil {
		t.Fatal(err)
	}
	msgs := receive(t, c, dlq, time.Second)
	if len(msgs) != 1 {
		t.Fatalf("DLQ holds %d messages, want 1", len(msgs))
	}
	return msgs[0]
}

// Metadata that fits beside the originals goes in attributes of its own.
// (An SQS origin adds two, so SQS dead letters always have it packed.)
func TestSinkMetadataAsSeparateAttributes(t *testing.T) {
	t.Parallel()
	dl := letter(0)
	dl.Origin = dedup.Origin{}
	m := sendAndReceive(t, dl)
	if _, packed := m.MessageAttributes[sqsdedup.MetadataAttribute]; packed {
		t.Errorf("metadata packed although it fits: %v", m.MessageAttributes)
	}
	if len(m.MessageAttributes) > 10 {
		t.Errorf("%d attributes", len(m.MessageAttributes))
	}
	checkMetadata(t, m, dl)
}

func TestSinkPacksMetadataBesideOriginals(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 9} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			t.Parallel()
			dl := letter(n)
			m := sendAndReceive(t, dl)
			if len(m.MessageAttributes) != n+1 {
				t.Errorf("%d attributes, want the %d originals and %s", len(m.MessageAttributes), n, sqsdedup.MetadataAttribute)
			}
			for _, h := range dl.Headers {
				if got := aws.ToString(m.MessageAttributes[h.Key].StringValue); got != string(h.Value) {
					t.Errorf("original %s = %q, want %q", h.Key, got, h.Value)
				}
			}
			checkMetadata(t, m, dl)
		})
	}
}

func checkMetadata(t *testing.T, m types.Message, dl dedup.DeadLetter) {
	t.Helper()
	if got := aws.ToString(m.Body); got != string(dl.Payload) {
		t.Errorf("body %q, want %q", got, dl.Payload)
	}
	meta, err := sqsdedup.DeadLetterMetadata(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range dl.Metadata() {
		if meta[h.Key] != string(h.Value) {
			t.Errorf("%s = %q, want %q", h.Key, meta[h.Key], h.Value)
		}
	}
}

// Dead-lettering a message again after a redrive replaces its old metadata.
func TestSinkReplacesEarlierMetadata(t *testing.T) {
	t.Parallel()
	dl := letter(2)
	dl.Headers = append(dl.Headers,
		dedup.Header{Key: "dedup-reason", Value: []byte("panic")},
		dedup.Header{Key: sqsdedup.MetadataAttribute, Value: []byte(`{"dedup-attempts":"9"}`)})
	m := sendAndReceive(t, dl)
	if len(m.MessageAttributes) != 3 {
		t.Errorf("attributes %v, want 2 originals and the metadata", m.MessageAttributes)
	}
	checkMetadata(t, m, dl)
}

// Values that are not SQS text travel as Binary, byte for byte.
func TestSinkKeepsBinaryAttributes(t *testing.T) {
	t.Parallel()
	dl := letter(0)
	dl.Headers = []dedup.Header{{Key: "raw", Value: []byte{0, 0xff, 1}}}
	m := sendAndReceive(t, dl)
	v := m.MessageAttributes["raw"]
	if aws.ToString(v.DataType) != "Binary" || string(v.BinaryValue) != "\x00\xff\x01" {
		t.Errorf("raw = %+v", v)
	}
}

// An original attribute keeps its SQS data type, custom types included.
func TestSinkKeepsAttributeTypes(t *testing.T) {
	t.Parallel()
	dl := letter(0)
	dl.Headers = []dedup.Header{
		{Key: "amount", Value: []byte("12.50"), Type: "Number"},
		{Key: "ratio", Value: []byte("0.5"), Type: "Number.float"},
		{Key: "blob", Value: []byte{1, 2}, Type: "Binary.gzip"},
		{Key: "name", Value: []byte("x"), Type: "String"},
	}
	m := sendAndReceive(t, dl)
	for name, want := range map[string]string{"amount": "Number", "ratio": "Number.float", "blob": "Binary.gzip", "name": "String"} {
		if got := aws.ToString(m.MessageAttributes[name].DataType); got != want {
			t.Errorf("attribute %s has type %q, want %q", name, got, want)
		}
	}
	if got := aws.ToString(m.MessageAttributes["amount"].StringValue); got != "12.50" {
		t.Errorf("amount = %q", got)
	}
}

func TestSinkRefusesWhatSQSCannotCarry(t *testing.T) {
	t.Parallel()
	c := client(t)
	dlq := queue(t, c)
	sink := newSink(t, c, dlq)
	ctx := context.Background()

	if err := sink.Send(ctx, letter(10)); !errors.Is(err, sqsdedup.ErrTooManyAttributes) {
		t.Errorf("10 original attributes: %v, want ErrTooManyAttributes", err)
	}
	big := letter(1)
	big.Payload = []byte(strings.Repeat("x", sqsdedup.DefaultMaxMessageSize))
	var tooLarge *sqsdedup.TooLargeError
	if err := sink.Send(ctx, big); !errors.As(err, &tooLarge) || tooLarge.Limit != sqsdedup.DefaultMaxMessageSize {
		t.Errorf("256 KiB body: %v, want a TooLargeError", err)
	}
	empty := letter(0)
	empty.Headers = []dedup.Header{{Key: "flag"}}
	if err := sink.Send(ctx, empty); err == nil {
		t.Error("an empty attribute value was accepted")
	}
	// Kafka headers may repeat a name: keeping one would drop the other.
	twice := letter(0)
	twice.Headers = []dedup.Header{{Key: "trace", Value: []byte("a")}, {Key: "trace", Value: []byte("b")}}
	if err := sink.Send(ctx, twice); err == nil {
		t.Error("a repeated attribute name was accepted")
	}
	// The SDK would replace the invalid byte: the letter would not be the
	// original.
	binary := letter(0)
	binary.Payload = []byte("proto\xff")
	if err := sink.Send(ctx, binary); err == nil {
		t.Error("a binary payload was accepted")
	}
	if msgs := receive(t, c, dlq, 0); len(msgs) != 0 {
		t.Errorf("DLQ holds %d messages, want 0", len(msgs))
	}
	// A queue that accepts more says so.
	if err := newSink(t, c, dlq, sqsdedup.WithMaxMessageSize(1<<20)).Send(ctx, big); err != nil {
		t.Errorf("256 KiB body under a 1 MiB limit: %v", err)
	}
}

// A FIFO DLQ keeps the original's message group, and drops a letter sent
// twice (a retry after a failed acknowledgement).
func TestSinkFIFO(t *testing.T) {
	t.Parallel()
	c := client(t)
	dlq := testenv.SQSQueue(t, c, map[string]string{"FifoQueue": "true"})
	sink := newSink(t, c, dlq)
	dl := letter(1)
	dl.MessageKey = []byte("customer-7")
	for range 2 {
		if err := sink.Send(context.Background(), dl); err != nil {
			t.Fatal(err)
		}
	}
	other := letter(0)
	other.EventID = "évènement 2" // not a valid group ID: hashed
	if err := sink.Send(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	var got []types.Message
	for range 2 {
		msgs := receive(t, c, dlq, time.Second)
		got = append(got, msgs...)
		for _, m := range msgs {
			deleteMessage(t, c, dlq, m)
		}
	}
	if len(got) != 2 {
		t.Fatalf("DLQ held %d letters, want 2", len(got))
	}
	groups := map[string]bool{}
	for _, m := range got {
		groups[m.Attributes["MessageGroupId"]] = true
	}
	if !groups["customer-7"] || len(groups) != 2 {
		t.Errorf("message groups %v, want customer-7 and a hashed one", groups)
	}
}

func TestSinkMisconfigured(t *testing.T) {
	c := testenv.SQS(t)
	for _, tc := range []struct {
		client *sqs.Client
		url    string
		opts   []sqsdedup.SinkOpt
	}{
		{nil, "https://sqs/q", nil},
		{c, "", nil},
		{c, "dlq", nil},
		{c, "https://sqs/q", []sqsdedup.SinkOpt{sqsdedup.WithMaxMessageSize(0)}},
	} {
		if _, err := sqsdedup.NewSink(tc.client, tc.url, tc.opts...); !errors.Is(err, dedup.ErrConfig) {
			t.Errorf("NewSink: %v, want ErrConfig", err)
		}
	}
	if err := new(sqsdedup.Sink).Send(context.Background(), letter(0)); !errors.Is(err, dedup.ErrConfig) {
		t.Errorf("Send on a zero Sink: %v, want ErrConfig", err)
	}
}
