package sqsdedup_test

import (
	"encoding/json"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// The consumer built WithSNSEnvelope passes the suite over notifications
// as SNS delivers them to a queue with raw message delivery off: the
// suite's ID is the notification's MessageId (a copy is SNS delivering the
// notification again), its payload the Message, its headers SNS message
// attributes; a letter's body is the notification as received.
func TestConformanceSNSEnvelope(t *testing.T) {
	adaptertest.Run(t, sqsFeatures, newSQSHarness(snsDelivery))
}

// The consumer built WithEventBridgeEnvelope passes the suite over events
// as a rule with no input transformer sends them to a queue: the suite's
// ID is the event's id, its payload the detail; a letter's body is the
// event as received.
func TestConformanceEventBridgeEnvelope(t *testing.T) {
	adaptertest.Run(t, sqsFeatures, newSQSHarness(eventBridgeDelivery))
}

var snsDelivery = delivery{
	opts: []sqsdedup.MessagesOpt{sqsdedup.WithSNSEnvelope()},
	body: func(t *testing.T, m adaptertest.Message) (string, map[string]types.MessageAttributeValue) {
		attrs := map[string]any{}
		for k, v := range m.Headers {
			attrs[k] = map[string]string{"Type": "String", "Value": v}
		}
		return envelopeBody(t, "sns-notification.json", map[string]any{
			"MessageId": m.ID, "Message": string(m.Payload), "MessageAttributes": attrs}), nil
	},
	read: func(m types.Message) adaptertest.Message {
		n, err := sqsdedup.UnwrapSNS(aws.ToString(m.Body))
		if err != nil { // dead-lettered before the handler runs
			return adaptertest.Message{Payload: []byte(aws.ToString(m.Body))}
		}
		msg := adaptertest.Message{ID: n.MessageID, Payload: []byte(n.Message), Headers: map[string]string{}}
		for k, v := range n.MessageAttributes {
			attr, _ := v.(map[string]any)
			msg.Headers[k], _ = attr["Value"].(string)
		}
		return msg
	},
	payload: func(t *testing.T, body string) []byte {
		n, err := sqsdedup.UnwrapSNS(body)
		if err != nil {
			t.Fatalf("letter body %q: %v", body, err)
		}
		return []byte(n.Message)
	},
}

var eventBridgeDelivery = delivery{
	opts: []sqsdedup.MessagesOpt{sqsdedup.WithEventBridgeEnvelope()},
	body: func(t *testing.T, m adaptertest.Message) (string, map[string]types.MessageAttributeValue) {
		return envelopeBody(t, "eventbridge-event.json", map[string]any{"id": m.ID, "detail": json.RawMessage(m.Payload)}), nil
	},
	read: func(m types.Message) adaptertest.Message {
		e, err := sqsdedup.UnwrapEventBridge(aws.ToString(m.Body))
		if err != nil { // dead-lettered before the handler runs
			return adaptertest.Message{Payload: []byte(aws.ToString(m.Body))}
		}
		return adaptertest.Message{ID: e.ID, Payload: e.Detail}
	},
	payload: func(t *testing.T, body string) []byte {
		e, err := sqsdedup.UnwrapEventBridge(body)
		if err != nil {
			t.Fatalf("letter body %q: %v", body, err)
		}
		return e.Detail
	},
}
