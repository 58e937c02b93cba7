package redisstreamdedup

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/propagation"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/wire"
)

// DefaultIDField is the field of an entry the event ID is read from unless
// [WithIDField] or [WithEntryID] says otherwise.
const DefaultIDField = wire.RedisIDField

// DefaultPayloadField is the field of an entry holding its payload, unless
// [WithPayloadField] names another; a [Sink] writes a letter's payload to it.
const DefaultPayloadField = wire.RedisPayloadField

// eventIDField carries, in a dead letter, the event ID of the entry it
// parks (dedup.DeadLetter.Metadata's dedup-event-id).
const eventIDField = dedup.MetadataPrefix + "event-id"

// Errors returned when an entry has no usable event ID; such an entry is
// dead-lettered with dedup.ReasonInvalidID.
var (
	// ErrNilMessage is returned for a nil *Message.
	ErrNilMessage = errors.New("redisstreamdedup: nil message")
	// ErrNoEventID is returned when an entry has no event ID field, or an
	// empty one.
	ErrNoEventID = errors.New("redisstreamdedup: entry has no event ID field")
)

// Message is one entry of a stream as a consumer group delivered it.
type Message struct {
	// XMessage is the entry: its ID and its fields. Its DeliveredCount is
	// how many times the group has delivered the entry, this delivery
	// included, as the group's pending entry list counts them.
	redis.XMessage
	// Stream is the key of the stream the entry was read from.
	Stream string
	// Group is the consumer group it was delivered to.
	Group string
}

// Field returns the value of the entry's field name, and whether it has it.
func (m *Message) Field(name string) (string, bool) {
	v, ok := m.Values[name]
	if !ok {
		return "", false
	}
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	}
	return fmt.Sprint(v), true
}

// MessagesOpt configures [Messages].
type MessagesOpt interface{ apply(*messagesConfig) }

type messagesOptFunc func(*messagesConfig)

func (f messagesOptFunc) apply(x *messagesConfig) { f(x) }

type messagesConfig struct {
	idField      string // "" with entryID
	entryID      bool
	payloadField string
}

// WithIDField reads the event ID from the named field instead of "id".
func WithIDField(name string) MessagesOpt {
	return messagesOptFunc(func(c *messagesConfig) { c.idField, c.entryID = name, false })
}

// WithEntryID makes the entry's own ID the event ID: every XADD of an
// event is then a new event, so a producer retrying an XADD whose reply it
// lost makes a second effect. Prefer an ID field the producer sets.
func WithEntryID() MessagesOpt {
	return messagesOptFunc(func(c *messagesConfig) { c.entryID = true })
}

// WithPayloadField reads the payload from the named field instead of
// "payload".
func WithPayloadField(name string) MessagesOpt {
	return messagesOptFunc(func(c *messagesConfig) { c.payloadField = name })
}

// Messages returns how a dedup.Wrapper reads a *Message: the event ID from
// the "id" field unless configured otherwise, the "payload" field as the
// fingerprinted payload (an entry without it is fingerprinted by its other
// fields, as a JSON object, dedup-* fields left out), the delivery count
// of the group's pending entry list as the transport's attempt count, the
// W3C trace context its producer propagated from its fields, and the entry
// as a dead letter. The delivery count includes the deliveries a
// [Consumer] gave back because the event was in flight elsewhere, so such
// an event may reach dedup.WithMaxAttempts with fewer handler runs.
//
// A dead letter's origin maps Redis Streams onto dedup.Origin: Stream is
// the stream's key, MessageID the entry ID, Group the consumer group and
// Timestamp the time in the entry ID. Its Payload is the payload field's
// value (nil without one) and its Headers the other fields, by name.
//
// With [WithEntryID], a dead letter moved back to its stream as it is (a
// new entry, with a new ID) is read with the event ID of the entry it
// parked, from its dedup-event-id field.
func Messages(opts ...MessagesOpt) dedup.Messages[*Message] {
	cfg := messagesConfig{idField: DefaultIDField, payloadField: DefaultPayloadField}
	for _, o := range opts {
		o.apply(&cfg)
	}
	return dedup.Messages[*Message]{
		EventID: func(m *Message) (string, error) {
			if m == nil {
				return "", ErrNilMessage
			}
			if cfg.entryID {
				if id, ok := m.Field(eventIDField); ok && id != "" {
					return id, nil
				}
				return m.ID, nil
			}
			id, ok := m.Field(cfg.idField)
			if !ok || id == "" {
				return "", fmt.Errorf("%w %q (stream %s, entry %s)", ErrNoEventID, cfg.idField, m.Stream, m.ID)
			}
			return id, nil
		},
		Payload: func(m *Message) []byte {
			if m == nil {
				return nil
			}
			if p, ok := m.Field(cfg.payloadField); ok {
				return []byte(p)
			}
			return fieldsJSON(m)
		},
		Attempts: func(m *Message) int {
			if m == nil {
				return 0
			}
			return int(min(m.DeliveredCount, 1<<31-1))
		},
		DeadLetter: func(m *Message) dedup.DeadLetter { return deadLetter(m, cfg.payloadField) },
		TraceCarrier: func(m *Message) propagation.TextMapCarrier {
			if m == nil {
				return fieldCarrier{}
			}
			return fieldCarrier{m: m}
		},
	}
}

// fieldsJSON returns the entry's fields but dedup-* ones as a JSON object
// with its keys in order.
func fieldsJSON(m *Message) []byte {
	fields := make(map[string]string, len(m.Values))
	for k := range m.Values {
		if !strings.HasPrefix(k, dedup.MetadataPrefix) {
			fields[k], _ = m.Field(k)
		}
	}
	b, _ := json.Marshal(fields) // a map of strings always marshals
	return b
}

// deadLetter returns the entry as it was read, with its origin.
func deadLetter(m *Message, payloadField string) dedup.DeadLetter {
	if m == nil {
		return dedup.DeadLetter{}
	}
	dl := dedup.DeadLetter{
		Origin: dedup.Origin{Stream: m.Stream, Group: m.Group, MessageID: m.ID, Timestamp: entryTime(m.ID)},
	}
	for k := range m.Values {
		v, _ := m.Field(k)
		if k == payloadField {
			dl.Payload = []byte(v)
			continue
		}
		dl.Headers = append(dl.Headers, dedup.Header{Key: k, Value: []byte(v)})
	}
	slices.SortFunc(dl.Headers, func(a, b dedup.Header) int { return strings.Compare(a.Key, b.Key) })
	return dl
}

// entryTime returns the time in an entry ID ("<ms>-<seq>"), or the zero
// time for an ID not of that form.
func entryTime(id string) time.Time {
	ms, _, ok := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if !ok || err != nil {
		return time.Time{}
	}
	return time.UnixMilli(n)
}

// fieldCarrier reads and writes a W3C trace context in an entry's fields.
type fieldCarrier struct{ m *Message }

func (c fieldCarrier) Get(key string) string {
	if c.m == nil {
		return ""
	}
	v, _ := c.m.Field(key)
	return v
}

func (c fieldCarrier) Set(key, value string) {
	if c.m != nil && c.m.Values != nil {
		c.m.Values[key] = value
	}
}

func (c fieldCarrier) Keys() []string {
	if c.m == nil {
		return nil
	}
	keys := make([]string, 0, len(c.m.Values))
	for k := range c.m.Values {
		keys = append(keys, k)
	}
	return keys
}
