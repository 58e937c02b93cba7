package sqsdedup_test

import (
	"errors"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
)

func TestEventID(t *testing.T) {
	fifo := map[string]string{"MessageDeduplicationId": "dedup-1", "MessageGroupId": "g"}
	binary := types.MessageAttributeValue{DataType: aws.String("Binary"), BinaryValue: []byte("bin-1")}
	for _, tc := range []struct {
		name   string
		opts   []sqsdedup.MessagesOpt
		attrs  map[string]types.MessageAttributeValue
		system map[string]string
		want   string // "" means ErrNoEventID
	}{
		{"default attribute", nil, map[string]types.MessageAttributeValue{"event-id": stringAttr("e-1")}, nil, "e-1"},
		{"binary attribute", nil, map[string]types.MessageAttributeValue{"event-id": binary}, nil, "bin-1"},
		{"named attribute", []sqsdedup.MessagesOpt{sqsdedup.WithIDAttribute("id")}, map[string]types.MessageAttributeValue{"id": stringAttr("e-2"), "event-id": stringAttr("no")}, nil, "e-2"},
		{"attribute before deduplication ID", nil, map[string]types.MessageAttributeValue{"event-id": stringAttr("e-3")}, fifo, "e-3"},
		{"FIFO deduplication ID", nil, nil, fifo, "dedup-1"},
		{"message ID", []sqsdedup.MessagesOpt{sqsdedup.WithIDFromMessageID()}, map[string]types.MessageAttributeValue{"event-id": stringAttr("no")}, fifo, "msg-1"},
		{"missing", nil, map[string]types.MessageAttributeValue{"other": stringAttr("x")}, nil, ""},
		{"missing named", []sqsdedup.MessagesOpt{sqsdedup.WithIDAttribute("id")}, map[string]types.MessageAttributeValue{"event-id": stringAttr("x")}, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := types.Message{MessageId: aws.String("msg-1"), Body: aws.String("b"), MessageAttributes: tc.attrs, Attributes: tc.system}
			got, err := sqsdedup.Messages("q", tc.opts...).EventID(m)
			check(t, got, err, tc.want)

			lm := events.SQSMessage{MessageId: "msg-1", Body: "b", Attributes: tc.system, MessageAttributes: map[string]events.SQSMessageAttribute{}}
			for k, v := range tc.attrs {
				lm.MessageAttributes[k] = events.SQSMessageAttribute{DataType: aws.ToString(v.DataType), StringValue: v.StringValue, BinaryValue: v.BinaryValue}
			}
			got, err = sqsdedup.LambdaMessages(tc.opts...).EventID(lm)
			check(t, got, err, tc.want)
		})
	}
}

func check(t *testing.T, got string, err error, want string) {
	t.Helper()
	switch {
	case want == "" && !errors.Is(err, sqsdedup.ErrNoEventID):
		t.Errorf("EventID = %q, %v; want ErrNoEventID", got, err)
	case want != "" && (err != nil || got != want):
		t.Errorf("EventID = %q, %v; want %q", got, err, want)
	}
}

func TestMessagesPayloadAttemptsDeadLetter(t *testing.T) {
	m := types.Message{
		MessageId: aws.String("msg-1"), Body: aws.String(`{"a":1}`),
		Attributes: map[string]string{"ApproximateReceiveCount": "3", "MessageGroupId": "g-1"},
		MessageAttributes: map[string]types.MessageAttributeValue{
			"z": stringAttr("last"), "event-id": stringAttr("e-1"),
			"bin": {DataType: aws.String("Binary"), BinaryValue: []byte{0, 1}},
		},
	}
	msgs := sqsdedup.Messages("https://sqs/q")
	if got := string(msgs.Payload(m)); got != `{"a":1}` {
		t.Errorf("Payload = %q", got)
	}
	if got := msgs.Attempts(m); got != 3 {
		t.Errorf("Attempts = %d, want 3", got)
	}
	dl := msgs.DeadLetter(m)
	want := []dedup.Header{{Key: "bin", Value: []byte{0, 1}}, {Key: "event-id", Value: []byte("e-1")}, {Key: "z", Value: []byte("last")}}
	if len(dl.Headers) != len(want) {
		t.Fatalf("headers %v, want %v", dl.Headers, want)
	}
	for i := range want {
		if dl.Headers[i].Key != want[i].Key || string(dl.Headers[i].Value) != string(want[i].Value) {
			t.Errorf("header %d = %v, want %v", i, dl.Headers[i], want[i])
		}
	}
	if string(dl.Payload) != `{"a":1}` || string(dl.MessageKey) != "g-1" ||
		dl.Origin != (dedup.Origin{QueueURL: "https://sqs/q", MessageID: "msg-1"}) {
		t.Errorf("dead letter %+v", dl)
	}

	lm := events.SQSMessage{MessageId: "msg-2", Body: "b", EventSourceARN: "arn:aws:sqs:us-east-1:1:q",
		Attributes: map[string]string{"ApproximateReceiveCount": "2"}}
	lmsgs := sqsdedup.LambdaMessages()
	if lmsgs.Attempts(lm) != 2 || string(lmsgs.Payload(lm)) != "b" {
		t.Errorf("Lambda attempts %d payload %q", lmsgs.Attempts(lm), lmsgs.Payload(lm))
	}
	if o := lmsgs.DeadLetter(lm).Origin; o.QueueURL != lm.EventSourceARN || o.MessageID != "msg-2" {
		t.Errorf("Lambda origin %+v", o)
	}
}
