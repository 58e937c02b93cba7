package sqsdedup

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"go.opentelemetry.io/otel/propagation"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/wire"
)

// DefaultIDAttribute is the message attribute the event ID is read from
// unless [WithIDAttribute] names another.
const DefaultIDAttribute = wire.SQSIDAttribute

// ErrNoEventID means a message carries no event ID where the consumer looks
// for one; the message is dead-lettered with dedup.ReasonInvalidID.
var ErrNoEventID = errors.New("sqsdedup: message carries no event ID")

// MessagesOpt chooses where [Messages] and [LambdaMessages] read the event
// ID, and whether the body is an SNS or EventBridge envelope.
type MessagesOpt interface{ apply(*idSource) }

type messagesOptFunc func(*idSource)

func (f messagesOptFunc) apply(x *idSource) { f(x) }

// WithIDAttribute reads the event ID from the named message attribute instead
// of "event-id". As with the default, a message of a FIFO queue without that
// attribute falls back to its MessageDeduplicationId.
func WithIDAttribute(name string) MessagesOpt {
	return messagesOptFunc(func(s *idSource) { s.attribute = name })
}

// WithIDFromMessageID uses the SQS MessageId as the event ID. It catches
// redeliveries but not a producer that sends one event twice (each send gets
// a new MessageId): use it only when producers cannot set an ID.
func WithIDFromMessageID() MessagesOpt {
	return messagesOptFunc(func(s *idSource) { s.messageID = true })
}

// idSource is where the event ID of a message is read.
type idSource struct {
	attribute string
	messageID bool
	// envelope, when set, reads the ID and payload inside the body instead
	// (see envelope.go); snsAttribute is WithSNSIDAttribute's name.
	envelope     unwrapper
	snsAttribute string
}

func newIDSource(opts []MessagesOpt) idSource {
	s := idSource{attribute: DefaultIDAttribute}
	for _, o := range opts {
		o.apply(&s)
	}
	return s
}

// eventID picks the ID from a message's MessageId, the attribute value
// returned by attr, or its MessageDeduplicationId system attribute.
func (s idSource) eventID(messageID string, attr func(name string) (string, bool), system map[string]string) (string, error) {
	if s.messageID {
		if messageID == "" {
			return "", fmt.Errorf("%w: no MessageId", ErrNoEventID)
		}
		return messageID, nil
	}
	if v, ok := attr(s.attribute); ok {
		return v, nil
	}
	if id := system[string(types.MessageSystemAttributeNameMessageDeduplicationId)]; id != "" {
		return id, nil
	}
	return "", fmt.Errorf("%w: no %q message attribute (and no MessageDeduplicationId)", ErrNoEventID, s.attribute)
}

// Messages returns how a dedup.Wrapper reads SQS messages received from
// queueURL: the event ID from the "event-id" message attribute (see
// [WithIDAttribute], [WithIDFromMessageID]), or on a FIFO queue from the
// MessageDeduplicationId when that attribute is absent; the body as the
// payload; ApproximateReceiveCount as the transport's attempt count; and the
// message as a dead letter with its attributes, MessageGroupId (as the
// message key) and origin. To compute the event ID yourself, replace the
// EventID field of the result.
//
// The consumer requests every message attribute and system attribute these
// need; a caller receiving messages itself must request them too.
//
// A W3C trace context in the message attributes (traceparent, as the
// outbox's SQS publisher writes it) parents the delivery's span.
func Messages(queueURL string, opts ...MessagesOpt) dedup.Messages[types.Message] {
	src := newIDSource(opts)
	return withEnvelope(src, dedup.Messages[types.Message]{
		EventID: func(m types.Message) (string, error) {
			return src.eventID(aws.ToString(m.MessageId), func(name string) (string, bool) {
				v, ok := m.MessageAttributes[name]
				return string(attributeBytes(v.StringValue, v.BinaryValue)), ok
			}, m.Attributes)
		},
		Payload:  func(m types.Message) []byte { return []byte(aws.ToString(m.Body)) },
		Attempts: func(m types.Message) int { return receiveCount(m.Attributes) },
		DeadLetter: func(m types.Message) dedup.DeadLetter {
			headers := make([]dedup.Header, 0, len(m.MessageAttributes))
			for name, v := range m.MessageAttributes {
				headers = append(headers, dedup.Header{Key: name, Value: attributeBytes(v.StringValue, v.BinaryValue), Type: aws.ToString(v.DataType)})
			}
			return deadLetter(aws.ToString(m.Body), headers, m.Attributes,
				dedup.Origin{QueueURL: queueURL, MessageID: aws.ToString(m.MessageId)})
		},
		TraceCarrier: func(m types.Message) propagation.TextMapCarrier { return attributeCarrier(m.MessageAttributes) },
	}, func(m types.Message) string { return aws.ToString(m.Body) })
}

func attributeBytes(s *string, b []byte) []byte {
	if s != nil {
		return []byte(*s)
	}
	return b
}

func receiveCount(system map[string]string) int {
	n, _ := strconv.Atoi(system[string(types.MessageSystemAttributeNameApproximateReceiveCount)])
	return n
}

func deadLetter(body string, headers []dedup.Header, system map[string]string, origin dedup.Origin) dedup.DeadLetter {
	slices.SortFunc(headers, func(a, b dedup.Header) int { return cmp.Compare(a.Key, b.Key) })
	dl := dedup.DeadLetter{Payload: []byte(body), Headers: headers, Origin: origin}
	if g := system[string(types.MessageSystemAttributeNameMessageGroupId)]; g != "" {
		dl.MessageKey = []byte(g)
	}
	return dl
}

// originQueue returns the queue URL msgs gives its letters' origin, or ""
// when it gives none or panics on an empty message (a DeadLetter of the
// caller's own making): then nothing is checked.
func originQueue(msgs dedup.Messages[types.Message]) (url string) {
	if msgs.DeadLetter == nil {
		return ""
	}
	defer func() {
		if recover() != nil {
			url = ""
		}
	}()
	return msgs.DeadLetter(types.Message{}).Origin.QueueURL
}
