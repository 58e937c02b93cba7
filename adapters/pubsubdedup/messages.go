package pubsubdedup

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"cloud.google.com/go/pubsub/v2"
	"go.opentelemetry.io/otel/propagation"

	"github.com/dedupkit/dedup"
)

// Errors returned when a message has no usable event ID; such a message is
// dead-lettered with dedup.ReasonInvalidID.
var (
	// ErrNilMessage is returned for a nil *pubsub.Message.
	ErrNilMessage = errors.New("pubsubdedup: nil message")
	// ErrNoEventID is returned when a message lacks the attribute
	// [WithIDAttribute] names, or has no message ID.
	ErrNoEventID = errors.New("pubsubdedup: message has no event ID")
)

// OriginMessageIDAttribute carries, in a dead letter, the message ID of the
// message it parks: a letter published again gets a message ID of its own,
// so [Messages] reads the event ID of a letter moved back to its topic from
// this attribute.
const OriginMessageIDAttribute = dedup.MetadataPrefix + "origin-message-id"

// MessagesOpt configures [Messages].
type MessagesOpt interface{ apply(*messagesConfig) }

type messagesOptFunc func(*messagesConfig)

func (f messagesOptFunc) apply(x *messagesConfig) { f(x) }

type messagesConfig struct {
	attribute string
	idFunc    func(*pubsub.Message) (string, error)
}

// WithIDAttribute reads the event ID from the named attribute instead of
// the message ID. Use it when producers may publish one event more than
// once (a retried publish gets a new message ID): the outbox publisher
// pubsuboutbox writes "event-id".
func WithIDAttribute(name string) MessagesOpt {
	return messagesOptFunc(func(c *messagesConfig) { c.attribute = name })
}

// WithIDFunc reads the event ID with f instead of from the message ID. f
// is never called with a nil message.
func WithIDFunc(f func(*pubsub.Message) (string, error)) MessagesOpt {
	return messagesOptFunc(func(c *messagesConfig) { c.idFunc = f })
}

// Messages returns how a dedup.Wrapper reads a *pubsub.Message: the event
// ID from the message ID unless configured otherwise, the data as the
// fingerprinted payload, the delivery attempt as the transport's attempt
// count when the subscription has a dead-letter policy (Pub/Sub sets it
// only then; otherwise the store counts alone), the W3C trace context its
// producer propagated from its attributes, and the message as a dead
// letter.
//
// The message ID is the server's: a producer that publishes an event twice
// (a retry after a lost answer) makes two message IDs, which only an ID
// the producer chooses catches ([WithIDAttribute]). A letter moved back to
// its topic as it is gets a new message ID too: its event ID is then read
// from its [OriginMessageIDAttribute], the original's.
//
// A dead letter keeps the original data and attributes, its ordering key
// as dedup.DeadLetter.MessageKey (the [Sink] publishes the letter with
// it), and its origin: Group is the subscription (given by the
// [Consumer]), MessageID the message ID, Timestamp the publish time.
func Messages(opts ...MessagesOpt) dedup.Messages[*pubsub.Message] {
	var cfg messagesConfig
	for _, o := range opts {
		o.apply(&cfg)
	}
	return dedup.Messages[*pubsub.Message]{
		EventID: func(m *pubsub.Message) (string, error) {
			switch {
			case m == nil:
				return "", ErrNilMessage
			case cfg.idFunc != nil:
				return cfg.idFunc(m)
			case cfg.attribute != "":
				if id, ok := m.Attributes[cfg.attribute]; ok {
					return id, nil
				}
				return "", fmt.Errorf("%w: no attribute %q (message %s)", ErrNoEventID, cfg.attribute, m.ID)
			}
			if id := originalID(m); id != "" {
				return id, nil
			}
			return "", fmt.Errorf("%w: no message ID", ErrNoEventID)
		},
		Payload: func(m *pubsub.Message) []byte {
			if m == nil {
				return nil
			}
			return m.Data
		},
		Attempts: func(m *pubsub.Message) int {
			if m == nil || m.DeliveryAttempt == nil {
				return 0
			}
			return *m.DeliveryAttempt
		},
		DeadLetter: deadLetter,
		TraceCarrier: func(m *pubsub.Message) propagation.TextMapCarrier {
			if m == nil {
				return attrCarrier(nil)
			}
			return attrCarrier(m.Attributes)
		},
	}
}

// originalID returns the message ID of the message m parks, if m is a dead
// letter moved back, else m's own.
func originalID(m *pubsub.Message) string {
	if id := m.Attributes[OriginMessageIDAttribute]; id != "" {
		return id
	}
	return m.ID
}

// deadLetter returns the message as it was received, with its origin.
func deadLetter(m *pubsub.Message) dedup.DeadLetter {
	if m == nil {
		return dedup.DeadLetter{}
	}
	hs := make([]dedup.Header, 0, len(m.Attributes))
	for k, v := range m.Attributes {
		hs = append(hs, dedup.Header{Key: k, Value: []byte(v)})
	}
	slices.SortFunc(hs, func(a, b dedup.Header) int { return cmp.Compare(a.Key, b.Key) })
	dl := dedup.DeadLetter{
		Payload: m.Data,
		Headers: hs,
		Origin:  dedup.Origin{MessageID: originalID(m), Timestamp: m.PublishTime},
	}
	if m.OrderingKey != "" {
		dl.MessageKey = []byte(m.OrderingKey)
	}
	return dl
}

// attrCarrier reads and writes a W3C trace context in a message's
// attributes; writing to a message without attributes does nothing.
type attrCarrier map[string]string

func (c attrCarrier) Get(key string) string { return c[key] }

func (c attrCarrier) Set(key, value string) {
	if c != nil {
		c[key] = value
	}
}

func (c attrCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
