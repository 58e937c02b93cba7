package natsdedup

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/wire"
)

// DefaultIDHeader is the header the event ID is read from unless
// [WithIDHeader] or [WithIDFunc] says otherwise: JetStream's own message ID,
// which its duplicate window already checks on publish.
const DefaultIDHeader = wire.NATSIDHeader

// Errors returned when a message has no usable event ID; such a message is
// dead-lettered with dedup.ReasonInvalidID.
var (
	// ErrNilMessage is returned for a nil jetstream.Msg.
	ErrNilMessage = errors.New("natsdedup: nil message")
	// ErrNoEventID is returned when a message carries no event ID header.
	ErrNoEventID = errors.New("natsdedup: message has no event ID header")
	// ErrAmbiguousEventID is returned when a message carries the ID header
	// more than once with different values.
	ErrAmbiguousEventID = errors.New("natsdedup: message has conflicting event ID headers")
)

// MessagesOpt configures [Messages].
type MessagesOpt interface{ apply(*messagesConfig) }

type messagesOptFunc func(*messagesConfig)

func (f messagesOptFunc) apply(x *messagesConfig) { f(x) }

type messagesConfig struct {
	header string
	idFunc func(jetstream.Msg) (string, error)
}

// WithIDHeader reads the event ID from the named header instead of
// "Nats-Msg-Id".
func WithIDHeader(name string) MessagesOpt {
	return messagesOptFunc(func(c *messagesConfig) { c.header = name })
}

// WithIDFunc reads the event ID with f instead of from a header. f is never
// called with a nil message.
func WithIDFunc(f func(jetstream.Msg) (string, error)) MessagesOpt {
	return messagesOptFunc(func(c *messagesConfig) { c.idFunc = f })
}

// Messages returns how a dedup.Wrapper reads a jetstream.Msg: the event ID
// from the "Nats-Msg-Id" header unless configured otherwise (JetStream drops
// a republish within the stream's duplicate window; the wrapper catches
// every copy after it), the data as the fingerprinted payload, the
// delivery count (NumDelivered) as the transport's attempt count, the W3C
// trace context its producer propagated from its headers, and the message
// as a dead letter. The delivery count includes the deliveries a
// [Consumer] naked because the event was in flight elsewhere, so such an
// event may reach dedup.WithMaxAttempts with fewer handler runs, as with
// SQS's receive count.
//
// A dead letter's origin maps JetStream onto dedup.Origin: Topic is the
// subject, Offset the stream sequence, Group the consumer, Timestamp the
// time the stream stored the message, Stream the stream's name and
// MessageID the message's "Nats-Msg-Id" header, if any. Partition is 0.
//
// A dead letter moved back to its stream as it is carries the letter's own
// Nats-Msg-Id (see [Sink]): for it, the ID and the origin's MessageID are
// read from its dedup-origin-message-id header, the original's.
func Messages(opts ...MessagesOpt) dedup.Messages[jetstream.Msg] {
	cfg := messagesConfig{header: DefaultIDHeader}
	for _, o := range opts {
		o.apply(&cfg)
	}
	return dedup.Messages[jetstream.Msg]{
		EventID: func(m jetstream.Msg) (string, error) {
			if m == nil {
				return "", ErrNilMessage
			}
			if cfg.idFunc != nil {
				return cfg.idFunc(m)
			}
			return headerID(m, idHeader(m.Headers(), cfg.header))
		},
		Payload: func(m jetstream.Msg) []byte {
			if m == nil {
				return nil
			}
			return m.Data()
		},
		Attempts: func(m jetstream.Msg) int {
			if m == nil {
				return 0
			}
			md, err := m.Metadata()
			if err != nil {
				return 0
			}
			return int(min(md.NumDelivered, 1<<31-1))
		},
		DeadLetter: deadLetter,
		TraceCarrier: func(m jetstream.Msg) propagation.TextMapCarrier {
			if m == nil {
				return headerCarrier(nil)
			}
			return headerCarrier(m.Headers())
		},
	}
}

// originIDHeader carries, in a dead letter, the Nats-Msg-Id of the message
// it parks: the letter's own is the letter's (see [Sink]).
const originIDHeader = dedup.MetadataPrefix + "origin-message-id"

// idHeader returns the header of h that holds what header name would: name,
// or, for Nats-Msg-Id in a dead letter moved back to its stream as it is,
// originIDHeader.
func idHeader(h nats.Header, name string) string {
	if name == jetstream.MsgIDHeader && h.Get(originIDHeader) != "" {
		return originIDHeader
	}
	return name
}

// headerID returns the value of header name; repeats must agree.
func headerID(m jetstream.Msg, name string) (string, error) {
	values := m.Headers().Values(name)
	if len(values) == 0 {
		return "", fmt.Errorf("%w %q (subject %s)", ErrNoEventID, name, m.Subject())
	}
	for _, v := range values[1:] {
		if v != values[0] {
			return "", fmt.Errorf("%w: %q is %q and %q", ErrAmbiguousEventID, name, values[0], v)
		}
	}
	return values[0], nil
}

// deadLetter returns the message as it was received, with its origin.
func deadLetter(m jetstream.Msg) dedup.DeadLetter {
	if m == nil {
		return dedup.DeadLetter{}
	}
	h := m.Headers()
	hs := make([]dedup.Header, 0, len(h))
	for k, vs := range h {
		for _, v := range vs {
			hs = append(hs, dedup.Header{Key: k, Value: []byte(v)})
		}
	}
	sortHeaders(hs)
	dl := dedup.DeadLetter{
		Payload: m.Data(),
		Headers: hs,
		Origin:  dedup.Origin{Topic: m.Subject(), MessageID: h.Get(idHeader(h, jetstream.MsgIDHeader))},
	}
	if md, err := m.Metadata(); err == nil {
		dl.Origin.Offset = int64(min(md.Sequence.Stream, 1<<63-1))
		dl.Origin.Group = md.Consumer
		dl.Origin.Timestamp = md.Timestamp
		dl.Origin.Stream = md.Stream
	}
	return dl
}

// headerCarrier reads and writes a W3C trace context in a message's headers.
type headerCarrier nats.Header

func (c headerCarrier) Get(key string) string { return nats.Header(c).Get(key) }

func (c headerCarrier) Set(key, value string) {
	if c != nil {
		nats.Header(c).Set(key, value)
	}
}

func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// sortHeaders orders headers by name, keeping the order of a name's values.
func sortHeaders(hs []dedup.Header) {
	slices.SortStableFunc(hs, func(a, b dedup.Header) int { return cmp.Compare(a.Key, b.Key) })
}
