// Package kafkadedup connects franz-go (kgo) to the dedup wrapper: it reads
// event IDs from Kafka records, runs a consumer-group poll loop that marks a
// record's offset only after its outcome is durable, and parks dead letters
// in a Kafka topic.
//
// A typical worker:
//
//	sink, _ := kafkadedup.NewSink(producer)
//	w, _ := dedup.Wrap(store, kafkadedup.Messages(), handle,
//		dedup.WithScope(dedup.Scope("billing", "charge")), dedup.WithSink(sink))
//	c, _ := kafkadedup.NewConsumer(w, kafkadedup.WithClientOpts(
//		kgo.SeedBrokers("localhost:9092"), kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("payments")))
//	err := c.Run(ctx)
package kafkadedup

import (
	"errors"
	"fmt"
	"strconv"

	"go.opentelemetry.io/otel/propagation"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/wire"
)

// Header names the event ID is read from by default.
const (
	// DefaultIDHeader is the header carrying the producer-assigned event ID.
	DefaultIDHeader = wire.KafkaIDHeader
	// CloudEventsIDHeader is the event ID header of the CloudEvents Kafka
	// protocol binding (binary mode); it is accepted when the ID header is
	// absent.
	CloudEventsIDHeader = "ce_id"
)

// Errors returned when a record has no usable event ID; such a record is
// dead-lettered with dedup.ReasonInvalidID.
var (
	// ErrNilRecord is returned for a nil *kgo.Record.
	ErrNilRecord = errors.New("kafkadedup: nil record")
	// ErrNoEventID is returned when a record carries no event ID header.
	ErrNoEventID = errors.New("kafkadedup: record has no event ID header")
	// ErrAmbiguousEventID is returned when a record carries the ID header
	// more than once with different values.
	ErrAmbiguousEventID = errors.New("kafkadedup: record has conflicting event ID headers")
)

// MessagesOpt configures [Messages].
type MessagesOpt interface{ apply(*messagesConfig) }

type messagesOptFunc func(*messagesConfig)

func (f messagesOptFunc) apply(x *messagesConfig) { f(x) }

type messagesConfig struct {
	header         string
	idFunc         func(*kgo.Record) (string, error)
	offsetFallback bool
}

// WithIDHeader reads the event ID from the named header instead of
// "event-id". The CloudEvents "ce_id" header is still accepted when it is
// absent.
func WithIDHeader(name string) MessagesOpt {
	return messagesOptFunc(func(c *messagesConfig) { c.header = name })
}

// WithIDFunc reads the event ID with f instead of from a header. f is never
// called with a nil record.
func WithIDFunc(f func(*kgo.Record) (string, error)) MessagesOpt {
	return messagesOptFunc(func(c *messagesConfig) { c.idFunc = f })
}

// WithOffsetFallback uses "topic/partition/offset" as the event ID of a
// record that carries no ID header. Such an ID only recognises redeliveries
// of the same record, never a producer's re-send of the event as a new
// record, which is why it is not the default.
func WithOffsetFallback() MessagesOpt {
	return messagesOptFunc(func(c *messagesConfig) { c.offsetFallback = true })
}

// Messages returns how the dedup wrapper reads a *kgo.Record: the event ID
// from the "event-id" (or "ce_id") header unless configured otherwise, the
// record value as the fingerprinted payload, the record as a dead letter,
// and the W3C trace context its producer propagated from its headers.
func Messages(opts ...MessagesOpt) dedup.Messages[*kgo.Record] {
	cfg := messagesConfig{header: DefaultIDHeader}
	for _, o := range opts {
		o.apply(&cfg)
	}
	return dedup.Messages[*kgo.Record]{
		EventID: func(r *kgo.Record) (string, error) {
			if r == nil {
				return "", ErrNilRecord
			}
			if cfg.idFunc != nil {
				return cfg.idFunc(r)
			}
			return cfg.headerID(r)
		},
		Payload: func(r *kgo.Record) []byte {
			if r == nil {
				return nil
			}
			return r.Value
		},
		DeadLetter:   deadLetter,
		TraceCarrier: func(r *kgo.Record) propagation.TextMapCarrier { return recordCarrier{r} },
	}
}

func (c *messagesConfig) headerID(r *kgo.Record) (string, error) {
	for _, name := range []string{c.header, CloudEventsIDHeader} {
		id, found, err := headerValue(r, name)
		if found || err != nil {
			return id, err
		}
	}
	if c.offsetFallback {
		return r.Topic + "/" + strconv.FormatInt(int64(r.Partition), 10) + "/" + strconv.FormatInt(r.Offset, 10), nil
	}
	return "", fmt.Errorf("%w %q (%s/%d@%d)", ErrNoEventID, c.header, r.Topic, r.Partition, r.Offset)
}

// headerValue returns the value of header name; repeats must agree.
func headerValue(r *kgo.Record, name string) (value string, found bool, err error) {
	for _, h := range r.Headers {
		if h.Key != name {
			continue
		}
		if found && string(h.Value) != value {
			return "", true, fmt.Errorf("%w: %q is %q and %q", ErrAmbiguousEventID, name, value, h.Value)
		}
		value, found = string(h.Value), true
	}
	return value, found, nil
}

// deadLetter returns the record as it was received, with its origin; the
// consumer's group is added by the Sink.
func deadLetter(r *kgo.Record) dedup.DeadLetter {
	if r == nil {
		return dedup.DeadLetter{}
	}
	hs := make([]dedup.Header, 0, len(r.Headers))
	for _, h := range r.Headers {
		hs = append(hs, dedup.Header{Key: h.Key, Value: h.Value})
	}
	return dedup.DeadLetter{
		Payload:    r.Value,
		MessageKey: r.Key,
		Headers:    hs,
		Origin:     dedup.Origin{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Timestamp: r.Timestamp},
	}
}
