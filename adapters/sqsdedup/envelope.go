package sqsdedup

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/dedupkit/dedup"
)

// ErrEnvelope means a message body is not the SNS notification or the
// EventBridge event the consumer was told to expect ([WithSNSEnvelope],
// [WithEventBridgeEnvelope]): the message is dead-lettered with
// dedup.ReasonInvalidID and this error's text, never run.
var ErrEnvelope = errors.New("sqsdedup: malformed envelope")

// The header (an SQS letter's message attribute) in which a dead letter
// keeps the envelope's fields, as one JSON object of strings.
const (
	SNSEnvelopeHeader         = "sns-envelope"
	EventBridgeEnvelopeHeader = "eventbridge-envelope"
)

// WithSNSEnvelope reads each message as an SNS notification delivered to the
// queue with raw message delivery off: the event ID is the notification's
// MessageId (see [WithSNSIDAttribute]) and the payload the fingerprint is
// computed over is its inner Message. A dead letter keeps the whole body as
// received (so that it can be sent back to the queue and its signature still
// verifies) and the envelope's fields in the [SNSEnvelopeHeader] header
// (Type, MessageId, TopicArn, Subject, Timestamp, SignatureVersion,
// Signature, SigningCertURL, UnsubscribeURL). A body that is no SNS notification is dead-lettered
// with [ErrEnvelope]. The handler still receives the SQS message; it reads
// the notification with [UnwrapSNS].
func WithSNSEnvelope() MessagesOpt {
	return messagesOptFunc(func(s *idSource) { s.envelope = unwrapSNS(s.snsAttribute) })
}

// WithSNSIDAttribute is [WithSNSEnvelope] with the event ID read from the
// named SNS message attribute (inside the envelope) instead of the SNS
// MessageId, for a publisher that sets its own ID: SNS gives each publish a
// new MessageId, so a publisher's retry is caught only this way. A
// notification without that attribute is dead-lettered with [ErrNoEventID].
func WithSNSIDAttribute(name string) MessagesOpt {
	return messagesOptFunc(func(s *idSource) { s.snsAttribute = name; s.envelope = unwrapSNS(name) })
}

// WithEventBridgeEnvelope reads each message as an EventBridge event sent to
// the queue by a rule whose target has no input transformer: the event ID is
// the event's id and the payload its detail. A dead letter keeps the whole
// body and the event's source, detail-type, id, time, account and region
// in the [EventBridgeEnvelopeHeader] header. A body that is no EventBridge event is
// dead-lettered with [ErrEnvelope]. The handler reads the event with
// [UnwrapEventBridge].
func WithEventBridgeEnvelope() MessagesOpt {
	return messagesOptFunc(func(s *idSource) { s.envelope = unwrapEventBridge })
}

// UnwrapSNS returns the SNS notification an SQS message body holds (raw
// message delivery off), or an error matching [ErrEnvelope].
func UnwrapSNS(body string) (events.SNSEntity, error) {
	var n events.SNSEntity
	if err := json.Unmarshal([]byte(body), &n); err != nil {
		return n, fmt.Errorf("%w: not an SNS notification: %v", ErrEnvelope, err)
	}
	switch {
	case n.Type != "Notification":
		return n, fmt.Errorf("%w: SNS Type %q, want Notification", ErrEnvelope, n.Type)
	case n.MessageID == "":
		return n, fmt.Errorf("%w: SNS notification without MessageId", ErrEnvelope)
	case n.Message == "":
		return n, fmt.Errorf("%w: SNS notification without Message", ErrEnvelope)
	}
	return n, nil
}

// UnwrapEventBridge returns the EventBridge event an SQS message body
// holds, or an error matching [ErrEnvelope].
func UnwrapEventBridge(body string) (events.EventBridgeEvent, error) {
	var e events.EventBridgeEvent
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		return e, fmt.Errorf("%w: not an EventBridge event: %v", ErrEnvelope, err)
	}
	switch {
	case e.ID == "":
		return e, fmt.Errorf("%w: EventBridge event without id", ErrEnvelope)
	case len(e.Detail) == 0 || bytes.Equal(e.Detail, []byte("null")):
		return e, fmt.Errorf("%w: EventBridge event without detail", ErrEnvelope)
	}
	return e, nil
}

// envelope is what a message body wrapped by SNS or EventBridge holds: the
// event ID, the inner payload and the fields a dead letter keeps.
type envelope struct {
	id      string
	payload []byte
	fields  []dedup.Header
}

// unwrapper reads the envelope of a body.
type unwrapper func(body string) (envelope, error)

func unwrapSNS(idAttribute string) unwrapper {
	return func(body string) (envelope, error) {
		n, err := UnwrapSNS(body)
		if err != nil {
			return envelope{}, err
		}
		// The signature covers the Timestamp as written, which a time.Time
		// would not give back (trailing zeros of its fraction).
		var raw struct{ Timestamp string }
		_ = json.Unmarshal([]byte(body), &raw) // it unmarshalled above
		env := envelope{id: n.MessageID, payload: []byte(n.Message), fields: envelopeHeader(SNSEnvelopeHeader,
			"Type", n.Type, "MessageId", n.MessageID, "TopicArn", n.TopicArn, "Subject", n.Subject,
			"Timestamp", raw.Timestamp, "SignatureVersion", n.SignatureVersion,
			"Signature", n.Signature, "SigningCertURL", n.SigningCertURL, "UnsubscribeURL", n.UnsubscribeURL)}
		if idAttribute != "" {
			// SNS writes a message attribute as {"Type": ..., "Value": ...}.
			attr, _ := n.MessageAttributes[idAttribute].(map[string]any)
			v, _ := attr["Value"].(string)
			if v == "" {
				return env, fmt.Errorf("%w: no %q SNS message attribute", ErrNoEventID, idAttribute)
			}
			env.id = v
		}
		return env, nil
	}
}

func unwrapEventBridge(body string) (envelope, error) {
	e, err := UnwrapEventBridge(body)
	if err != nil {
		return envelope{}, err
	}
	return envelope{id: e.ID, payload: e.Detail, fields: envelopeHeader(EventBridgeEnvelopeHeader,
		"source", e.Source, "detail-type", e.DetailType, "id", e.ID,
		"time", e.Time.Format(time.RFC3339Nano), "account", e.AccountID, "region", e.Region)}, nil
}

// envelopeHeader returns the named header holding the non-empty values of
// name, value pairs as one JSON object: one attribute, so that the letter
// still has room for the original's under SQS's limit of 10.
func envelopeHeader(name string, pairs ...string) []dedup.Header {
	fields := make(map[string]string, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] != "" {
			fields[pairs[i]] = pairs[i+1]
		}
	}
	v, _ := json.Marshal(fields) // a map of strings always marshals
	return []dedup.Header{{Key: name, Value: v, Type: "String"}}
}

// withEnvelope returns msgs reading the event ID and payload of each message
// from the envelope its body holds, and adding the envelope's fields to its
// dead letter; msgs itself when s expects no envelope.
func withEnvelope[M any](s idSource, msgs dedup.Messages[M], body func(M) string) dedup.Messages[M] {
	if s.envelope == nil {
		return msgs
	}
	unwrap, letter := s.envelope, msgs.DeadLetter
	msgs.EventID = func(m M) (string, error) {
		env, err := unwrap(body(m))
		return env.id, err
	}
	msgs.Payload = func(m M) []byte {
		env, err := unwrap(body(m))
		if err != nil {
			// Dead-lettered by EventID's error before the payload counts.
			return []byte(body(m))
		}
		return env.payload
	}
	msgs.DeadLetter = func(m M) dedup.DeadLetter {
		dl := letter(m)
		if env, err := unwrap(body(m)); err == nil {
			dl.Headers = append(dl.Headers, env.fields...)
		}
		return dl
	}
	return msgs
}
