package amqpdedup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
)

// ErrNoDLQ means a [Sink] has no routing key for a letter: its origin
// queue is unknown and no routing function names one.
var ErrNoDLQ = errors.New("amqpdedup: no dead-letter routing key for this letter")

// ErrNacked means the broker refused a dead letter (a negative publisher
// confirm); the original delivery is not acknowledged.
var ErrNacked = errors.New("amqpdedup: the broker refused the dead letter")

// UnroutableError means the broker routed a dead letter to no queue: the
// exchange has no binding for its routing key, or the dead-letter queue does
// not exist. The letter was published as mandatory, so the broker returned
// it instead of dropping it; the original delivery is not acknowledged.
type UnroutableError struct {
	Exchange   string
	RoutingKey string
	ReplyText  string
}

func (e *UnroutableError) Error() string {
	return fmt.Sprintf("amqpdedup: dead letter unroutable: exchange %q, routing key %q: %s", e.Exchange, e.RoutingKey, e.ReplyText)
}

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
	url        string
	amqp       amqp.Config
	exchange   string
	routingKey func(queue string) string

	mu      sync.Mutex // one publish at a time: a return is then this letter's
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
}

// NewSink returns a Sink publishing to the broker at url.
func NewSink(url string, opts ...SinkOpt) (*Sink, error) {
	s := &Sink{url: url, amqp: amqp.Config{Heartbeat: 10 * time.Second, Locale: "en_US"},
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
	if err := s.connect(); err != nil {
		return err
	}
	dc, err := s.ch.PublishWithDeferredConfirmWithContext(ctx, s.exchange, key, true, false, pub)
	if err != nil {
		s.reset()
		return fmt.Errorf("publish to exchange %q, routing key %q: %w", s.exchange, key, err)
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		// The confirmation may still come: a channel whose state is
		// unknown is not used again.
		s.reset()
		return fmt.Errorf("waiting for the broker's confirmation: %w", err)
	}
	// The broker returns an unroutable mandatory message before confirming
	// it, and the client hands returns over before confirmations.
	select {
	case ret := <-s.returns:
		return &UnroutableError{Exchange: ret.Exchange, RoutingKey: ret.RoutingKey, ReplyText: ret.ReplyText}
	default:
	}
	if !acked {
		if s.ch.IsClosed() {
			s.reset()
			return fmt.Errorf("%w: the channel closed before the confirmation", ErrNacked)
		}
		return ErrNacked
	}
	return nil
}

// connect opens the connection and the confirm channel if they are not
// open.
func (s *Sink) connect() error {
	if s.ch != nil && !s.ch.IsClosed() {
		return nil
	}
	s.reset()
	cfg := s.amqp
	cfg.Properties = amqp.Table{"connection_name": "amqpdedup sink"}
	for k, v := range s.amqp.Properties {
		cfg.Properties[k] = v
	}
	conn, err := amqp.DialConfig(s.url, cfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		conn.Close()
		return fmt.Errorf("open a confirm channel: %w", err)
	}
	s.conn, s.ch = conn, ch
	s.returns = ch.NotifyReturn(make(chan amqp.Return, 1))
	return nil
}

// reset closes the connection, if any, so that the next Send opens another.
func (s *Sink) reset() {
	if s.conn != nil {
		s.conn.Close()
	}
	s.conn, s.ch, s.returns = nil, nil, nil
}

// Close closes the sink's connection. A Send after Close connects again.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reset()
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
