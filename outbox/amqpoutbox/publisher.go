// Package amqpoutbox publishes outbox events to RabbitMQ with amqp091-go:
// one persistent message per event, routed by the event's destination as
// routing key, with the event ID as message_id, where amqpdedup reads it,
// and the event's key in the "event-key" header ([KeyHeader]).
//
//	pub, _ := amqpoutbox.NewPublisher(url)
//	relay, _ := outbox.NewRelay(ob, pgConfig, pub)
//	err := relay.Run(ctx)
package amqpoutbox

import (
	"context"
	"fmt"
	"sync"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/amqpconn"
	"github.com/dedupkit/dedup/internal/wire"
	"github.com/dedupkit/dedup/outbox"
)

// TenantHeader is the header carrying an event's tenant, when it has one.
const TenantHeader = wire.TenantHeader

// KeyHeader is the header carrying an event's key (outbox.Event.Key), when
// it has one: a string when the key is UTF-8, else a byte array. The
// routing key is the event's destination, so the key the outbox ordered
// the event by travels here; a header of this name among the event's
// headers is not sent.
const KeyHeader = "event-key"

// Opt configures a [Publisher].
type Opt interface{ apply(*Publisher) }

type optFunc func(*Publisher)

func (f optFunc) apply(p *Publisher) { f(p) }

// WithExchange publishes to the named exchange instead of the default
// exchange, which routes an event to the queue its destination names.
func WithExchange(name string) Opt { return optFunc(func(p *Publisher) { p.exchange = name }) }

// WithDialConfig sets how the publisher connects (TLS, SASL, heartbeat,
// vhost, dialer).
func WithDialConfig(cfg amqp.Config) Opt { return optFunc(func(p *Publisher) { p.amqp = cfg }) }

// Publisher publishes outbox events to RabbitMQ on a channel in confirm
// mode, each event persistent and mandatory: an event is reported sent only
// once the broker confirmed it, and an event the broker routes nowhere is a
// permanent error (amqpdedup.UnroutableError), not a silent drop. An
// event's message carries its ID as message_id, its headers, its tenant in
// the "tenant" header, its key in the "event-key" header ([KeyHeader]), and
// its destination as routing key.
//
// A batch is published in order on one channel, and RabbitMQ keeps the
// order of one channel's messages in a queue, so events of one destination
// and key arrive in publication order. Should the broker refuse an event
// (amqpdedup.ErrNacked: RabbitMQ does so only on an internal error of a
// queue) or the connection drop while a batch is confirmed, events
// published after it may have arrived already: the relay publishes the
// failed event again, after them.
//
// The Publisher has its own connection, opened on the first Publish and
// again after it is lost; Close closes it.
type Publisher struct {
	exchange string
	amqp     amqp.Config

	mu   sync.Mutex // one batch at a time: the channel's returns are then this batch's
	conn *amqpconn.Confirmed
}

// NewPublisher returns a Publisher to the broker at url.
func NewPublisher(url string, opts ...Opt) (*Publisher, error) {
	p := &Publisher{amqp: amqpconn.DefaultConfig()}
	for _, o := range opts {
		o.apply(p)
	}
	if _, err := amqp.ParseURI(url); err != nil {
		return nil, fmt.Errorf("%w: amqpoutbox: %v", dedup.ErrConfig, err)
	}
	p.conn = amqpconn.NewConfirmed(url, p.amqp, "amqpoutbox relay")
	return p, nil
}

// Publish publishes events in order, then waits for the broker's
// confirmations, and reports each event's result. When publishing fails
// midway (the connection lost), the events after the failed one are left
// unsent (outbox.ErrNotAttempted).
func (p *Publisher) Publish(ctx context.Context, events []outbox.Event) []error {
	errs := make([]error, len(events))
	p.mu.Lock()
	defer p.mu.Unlock()
	ch, returns, err := p.conn.Channel()
	if err != nil {
		for i := range errs {
			errs[i] = fmt.Errorf("amqpoutbox: %w", err)
		}
		return errs
	}
	returned := amqpconn.CollectReturns(returns)
	confirms := make([]*amqp.DeferredConfirmation, 0, len(events))
	for i := range events {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, p.exchange, events[i].Destination, true, false, publishing(&events[i]))
		if err != nil {
			errs[i] = fmt.Errorf("amqpoutbox: publish event %s: %w", events[i].ID, err)
			for j := i + 1; j < len(events); j++ {
				errs[j] = outbox.ErrNotAttempted
			}
			break
		}
		confirms = append(confirms, dc)
	}
	reusable := len(confirms) == len(events)
	for i, dc := range confirms {
		acked, err := dc.WaitContext(ctx)
		switch {
		case err != nil:
			errs[i], reusable = fmt.Errorf("amqpoutbox: event %s not confirmed: %w", events[i].ID, err), false
		case !acked:
			errs[i] = fmt.Errorf("amqpoutbox: event %s: %w", events[i].ID, amqpconn.ErrNacked)
			reusable = reusable && !ch.IsClosed()
		}
	}
	if rets := returned(); len(rets) > 0 {
		for i := range events {
			if ret, ok := rets[events[i].ID]; ok && errs[i] == nil {
				errs[i] = dedup.Permanent(fmt.Errorf("amqpoutbox: event %s: %w", events[i].ID,
					amqpconn.Unroutable(ret)))
			}
		}
	}
	if !reusable {
		// A channel whose confirmations are unknown is not used again.
		p.conn.Reset()
	}
	return errs
}

// publishing is the message of e.
func publishing(e *outbox.Event) amqp.Publishing {
	headers := make(amqp.Table, len(e.Headers)+2)
	for _, h := range e.Headers {
		if h.Key == KeyHeader {
			continue // the event's own key wins, or none is sent
		}
		headers[h.Key] = headerValue(h.Value)
	}
	if e.Tenant != "" {
		headers[TenantHeader] = e.Tenant
	}
	if len(e.Key) > 0 {
		headers[KeyHeader] = headerValue(e.Key)
	}
	return amqp.Publishing{Headers: headers, Body: e.Payload, MessageId: e.ID, DeliveryMode: amqp.Persistent}
}

// headerValue is v as text when it is UTF-8, else as bytes.
func headerValue(v []byte) any {
	if utf8.Valid(v) {
		return string(v)
	}
	return v
}

// Close closes the publisher's connection. A Publish after Close connects
// again.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conn.Reset()
	return nil
}
