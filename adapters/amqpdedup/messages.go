package amqpdedup

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/propagation"

	"github.com/dedupkit/dedup"
)

// ErrNoEventID means a delivery carries no event ID where the consumer looks
// for one; the delivery is dead-lettered with dedup.ReasonInvalidID.
var ErrNoEventID = errors.New("amqpdedup: delivery carries no event ID")

// deliveryCountHeader is the header quorum queues count a message's earlier
// deliveries in, and a publisher can write too.
const deliveryCountHeader = "x-delivery-count"

// MessagesOpt chooses where [Messages] reads the event ID.
type MessagesOpt interface{ apply(*idSource) }

type messagesOptFunc func(*idSource)

func (f messagesOptFunc) apply(x *idSource) { f(x) }

// WithIDHeader reads the event ID from the named header instead of the
// message_id property. The header's value must be a string or bytes.
func WithIDHeader(name string) MessagesOpt {
	return messagesOptFunc(func(s *idSource) { s.header, s.fn = name, nil })
}

// WithIDFunc computes the event ID of a delivery with f; an error
// dead-letters the delivery with dedup.ReasonInvalidID.
func WithIDFunc(f func(amqp.Delivery) (string, error)) MessagesOpt {
	return messagesOptFunc(func(s *idSource) { s.header, s.fn = "", f })
}

// idSource is where the event ID of a delivery is read: fn, else the header
// named header, else the message_id property.
type idSource struct {
	header string
	fn     func(amqp.Delivery) (string, error)
}

func (s idSource) eventID(d amqp.Delivery) (string, error) {
	switch {
	case s.fn != nil:
		return s.fn(d)
	case s.header != "":
		v, ok := d.Headers[s.header]
		if !ok {
			return "", fmt.Errorf("%w: no %q header", ErrNoEventID, s.header)
		}
		id, ok := text(v)
		if !ok {
			return "", fmt.Errorf("%w: the %q header is a %T, not text", ErrNoEventID, s.header, v)
		}
		return id, nil
	case d.MessageId == "":
		return "", fmt.Errorf("%w: no message_id property", ErrNoEventID)
	}
	return d.MessageId, nil
}

// Messages returns how a dedup.Wrapper reads deliveries from queue: the event
// ID from the message_id property (see [WithIDHeader], [WithIDFunc]); the
// body as the payload; the broker's delivery count as the transport's
// attempt count, where the broker keeps one; and the delivery as a dead
// letter with its headers, its routing key as the message key, and its
// origin. A W3C trace context in the headers (traceparent, as the outbox's
// publishers write it) parents the delivery's span.
//
// The queue's name is given once, to [NewConsumer]: a delivery a Consumer
// hands over carries its queue, which is the letter's origin, so queue may
// be "" (it names the origin of deliveries no Consumer handed over); a
// Consumer reports another name as a configuration error.
//
// RabbitMQ counts deliveries only on a quorum queue, in x-delivery-count,
// and only from the second delivery on: a publisher can set a header of
// that name too (application code copying headers, a shovel), which a
// classic queue passes through and a quorum queue may pass through on a
// first delivery. So the count is read only from a redelivery
// (Redelivered set) handed over by a [Consumer] that found its queue to be
// a quorum queue, as x-delivery-count plus one; every other delivery counts
// none (0), and the store counts attempts alone.
func Messages(queue string, opts ...MessagesOpt) dedup.Messages[amqp.Delivery] {
	var src idSource
	for _, o := range opts {
		o.apply(&src)
	}
	return dedup.Messages[amqp.Delivery]{
		EventID: func(d amqp.Delivery) (string, error) {
			queueOf(d, queue) // a Consumer of another queue hears of it at once
			return src.eventID(d)
		},
		Payload:  func(d amqp.Delivery) []byte { return d.Body },
		Attempts: attempts,
		DeadLetter: func(d amqp.Delivery) dedup.DeadLetter {
			return dedup.DeadLetter{
				Payload:    d.Body,
				MessageKey: []byte(d.RoutingKey),
				Headers:    headers(d.Headers),
				Origin: dedup.Origin{Queue: queueOf(d, queue), Exchange: d.Exchange, RoutingKey: d.RoutingKey,
					DeliveryTag: d.DeliveryTag, MessageID: d.MessageId, Timestamp: d.Timestamp},
			}
		},
		TraceCarrier: func(d amqp.Delivery) propagation.TextMapCarrier { return tableCarrier(d.Headers) },
	}
}

// attempts returns the delivery's attempt, counting this one, from the
// x-delivery-count of a quorum queue's redelivery; 0 for any other
// delivery, whose x-delivery-count, if any, the publisher wrote.
func attempts(d amqp.Delivery) int {
	if by := deliveredBy(d); by == nil || !by.quorum || !d.Redelivered {
		return 0
	}
	switch n := d.Headers[deliveryCountHeader].(type) {
	case int64:
		return int(n) + 1
	case int32:
		return int(n) + 1
	case int:
		return n + 1
	}
	return 0
}

// headers returns a delivery's headers as dead-letter headers, sorted by
// name: text as it is, numbers and times formatted, nested tables and
// arrays (x-death) in Go's %v form.
func headers(t amqp.Table) []dedup.Header {
	hs := make([]dedup.Header, 0, len(t))
	for k, v := range t {
		s, ok := text(v)
		if !ok {
			s = format(v)
		}
		hs = append(hs, dedup.Header{Key: k, Value: []byte(s)})
	}
	slices.SortFunc(hs, func(a, b dedup.Header) int { return cmp.Compare(a.Key, b.Key) })
	return hs
}

// text returns v when it is a string or bytes.
func text(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	}
	return "", false
}

func format(v any) string {
	switch v := v.(type) {
	case int64:
		return strconv.FormatInt(v, 10)
	case int32:
		return strconv.FormatInt(int64(v), 10)
	case time.Time:
		return v.UTC().Format(time.RFC3339)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}

// tableCarrier reads a W3C trace context from a delivery's headers.
type tableCarrier amqp.Table

func (c tableCarrier) Get(key string) string {
	s, _ := text(c[key])
	return s
}

func (c tableCarrier) Set(key, value string) { c[key] = value }

func (c tableCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
