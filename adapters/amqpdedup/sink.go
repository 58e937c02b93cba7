package amqpdedup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/amqpconn"
)

// ErrNoDLQ means a [Sink] has no routing key for a letter: its origin
// queue is unknown and no routing function names one.
var ErrNoDLQ = errors.New("amqpdedup: no dead-letter routing key for this letter")

// ErrNacked means the broker refused a message (a negative publisher
// confirm, which RabbitMQ sends on an internal error of a queue): for a dead
// letter, the original delivery is not acknowledged. The amqpoutbox
// publisher returns it too.
var ErrNacked = amqpconn.ErrNacked

// UnroutableError means the broker routed a message to no queue: the
// exchange has no binding for its routing key, or, on the default exchange,
// no queue has that name. The message was published as mandatory, so the
// broker returned it instead of dropping it: for a dead letter, the
// original delivery is not acknowledged. The amqpoutbox publisher returns
// it too.
type UnroutableError = amqpconn.UnroutableError

// SinkOpt configures a [Sink].
type SinkOpt interface{ apply(*Sink) }

type sinkOptFunc func(*Sink)

func (f sinkOptFunc) apply(x *Sink) { f(x) }

// WithExchange publishes dead letters to the named exchange instead of the
// default exchange, which routes a letter to the queue its routing key
// names: for example the exchange given to the origin queue as its
// x-dead-letter-exchange, so that what RabbitMQ dead-letters itself (an
// expired or rejected message, an overflow) and what the wrapper parks
// land in the same place.
func WithExchange(name string) SinkOpt { return sinkOptFunc(func(s *Sink) { s.exchange = name }) }

// WithRoutingKey sets the routing key of a letter from its origin queue
// (default: the queue's name followed by ".dlq").
func WithRoutingKey(f func(queue string) string) SinkOpt {
	return sinkOptFunc(func(s *Sink) { s.routingKey = f })
}

// WithSinkDialConfig sets how the sink connects (TLS, SASL, heartbeat,
// vhost, dialer).
func WithSinkDialConfig(cfg amqp.Config) SinkOpt { return sinkOptFunc(func(s *Sink) { s.amqp = cfg }) }

// Sink is a dedup.Sink that publishes dead letters to RabbitMQ, persistent,
// as mandatory, on a channel in confirm mode: Send returns nil only once the
// broker confirmed the letter, and an error when the broker refused it
// ([ErrNacked]) or could route it nowhere ([UnroutableError]), so the
// original delivery is acknowledged only once its letter is safe.
//
// A letter keeps the original body, message_id and headers and adds the
// dedup-* metadata (see dedup.DeadLetter.Metadata). The headers the broker
// owns (x-death, x-delivery-count, x-first-death-*, x-last-death-*) are not
// copied: RabbitMQ writes its own on the letter, and what they said is in
// the metadata (dedup-attempts, dedup-origin-*).
//
// The Sink has its own connection, opened on the first Send and again after
// it is lost; Close closes it. It publishes one letter at a time.
type Sink struct {
	exchange   string
	routingKey func(queue string) string
	url        string
	amqp       amqp.Config

	mu   sync.Mutex
	conn *amqpconn.Confirmed
}

// NewSink returns a Sink publishing to the broker at url.
func NewSink(url string, opts ...SinkOpt) (*Sink, error) {
	s := &Sink{url: url, amqp: amqpconn.DefaultConfig(),
		routingKey: func(queue string) string {
			if queue == "" {
				return ""
			}
			return queue + ".dlq"
		}}
	for _, o := range opts {
		o.apply(s)
	}
	if _, err := amqp.ParseURI(url); err != nil {
		return nil, fmt.Errorf("%w: amqpdedup sink: %v", dedup.ErrConfig, err)
	}
	if s.routingKey == nil {
		return nil, fmt.Errorf("%w: amqpdedup.WithRoutingKey: nil function", dedup.ErrConfig)
	}
	s.conn = amqpconn.NewConfirmed(url, s.amqp, "amqpdedup sink")
	return s, nil
}

// Send publishes dl and waits for the broker's confirmation.
func (s *Sink) Send(ctx context.Context, dl dedup.DeadLetter) error {
	key := s.routingKey(dl.Origin.Queue)
	if key == "" {
		return fmt.Errorf("%w: %s/%s from queue %q", ErrNoDLQ, dl.Scope, dl.EventID, dl.Origin.Queue)
	}
	pub := amqp.Publishing{
		Headers:      letterHeaders(dl.HeadersWithMetadata()),
		Body:         dl.Payload,
		DeliveryMode: amqp.Persistent,
		MessageId:    dl.Origin.MessageID,
		Timestamp:    dl.Origin.Timestamp,
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.publish(ctx, key, pub); err != nil {
		return fmt.Errorf("amqpdedup: dead letter %s/%s: %w", dl.Scope, dl.EventID, err)
	}
	return nil
}

func (s *Sink) publish(ctx context.Context, key string, pub amqp.Publishing) error {
	ch, returns, err := s.conn.Channel()
	if err != nil {
		return err
	}
	returned := amqpconn.CollectReturns(returns)
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, s.exchange, key, true, false, pub)
	if err != nil {
		returned()
		s.conn.Reset()
		return fmt.Errorf("publish to exchange %q, routing key %q: %w", s.exchange, key, err)
	}
	acked, err := dc.WaitContext(ctx)
	if ret, ok := returned()[pub.MessageId]; ok {
		return amqpconn.Unroutable(ret)
	}
	switch {
	case err != nil:
		s.conn.Reset()
		return fmt.Errorf("waiting for the broker's confirmation: %w", err)
	case !acked && ch.IsClosed():
		s.conn.Reset()
		return fmt.Errorf("%w: the channel closed before the confirmation", ErrNacked)
	case !acked:
		return ErrNacked
	}
	return nil
}

// Close closes the sink's connection. A Send after Close connects again.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conn.Reset()
	return nil
}

// letterHeaders returns hs as an AMQP table, without the headers the
// broker owns.
func letterHeaders(hs []dedup.Header) amqp.Table {
	t := make(amqp.Table, len(hs))
	for _, h := range hs {
		if brokerOwned(h.Key) {
			continue
		}
		t[h.Key] = string(h.Value)
	}
	return t
}

func brokerOwned(name string) bool {
	return name == "x-death" || name == deliveryCountHeader ||
		strings.HasPrefix(name, "x-first-death-") || strings.HasPrefix(name, "x-last-death-")
}
