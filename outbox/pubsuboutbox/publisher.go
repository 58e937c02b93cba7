// Package pubsuboutbox publishes outbox events to Google Cloud Pub/Sub
// (cloud.google.com/go/pubsub/v2): one message per event, with the event's
// destination as topic, its ID in the "event-id" attribute ([IDAttribute]),
// where pubsubdedup.WithIDAttribute reads it, its tenant in "tenant", and
// its key as the message's ordering key, so that a subscription with
// message ordering delivers the events of one key in the outbox's order.
// A relay that publishes an event again (it died before marking the row
// sent) makes a second message with the same "event-id", which the
// consumer's wrapper answers as a duplicate.
//
//	pub, _ := pubsuboutbox.NewPublisher(client)
//	defer pub.Stop()
//	relay, _ := outbox.NewRelay(ob, pgConfig, pub)
//	err := relay.Run(ctx)
package pubsuboutbox

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"

	"cloud.google.com/go/pubsub/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/wire"
	"github.com/dedupkit/dedup/outbox"
)

// IDAttribute is the attribute carrying an event's ID.
const IDAttribute = wire.PubSubIDAttribute

// TenantAttribute is the attribute carrying an event's tenant, when it has
// one.
const TenantAttribute = wire.TenantHeader

// MaxOrderingKey is the most bytes Pub/Sub takes in an ordering key.
const MaxOrderingKey = 1024

// What Pub/Sub takes in a message's attributes.
const (
	maxAttributes     = 100
	maxAttributeKey   = 256
	maxAttributeValue = 1024
)

// Publisher publishes outbox events with a *pubsub.Client: one
// pubsub.Publisher per topic, with message ordering on, made on first use
// and stopped by [Publisher.Stop].
type Publisher struct {
	client *pubsub.Client

	mu     sync.Mutex
	topics map[string]*pubsub.Publisher
}

// NewPublisher returns a Publisher publishing with client, which the
// caller owns and closes after [Publisher.Stop].
func NewPublisher(client *pubsub.Client) (*Publisher, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: pubsuboutbox: nil client", dedup.ErrConfig)
	}
	return &Publisher{client: client, topics: map[string]*pubsub.Publisher{}}, nil
}

// Publish publishes events and reports each one's result once the server
// stored it. An event's destination is a topic ID in the client's project
// or a full name "projects/P/topics/T"; its key is the message's ordering
// key (as it is when it is UTF-8, else in standard base64).
//
// The events of one topic and key are handed to the client in order, which
// sends them in order. When one fails, the client pauses its key and
// refuses the later ones without sending them: those, and those sent in
// the same failed request, get outbox.ErrNotAttempted, and the key is
// resumed (pubsub.Publisher.ResumePublish) before Publish returns, so that
// the next pass sends the failed event first. Events without a key, and
// different keys, are published concurrently, in batches the client makes.
//
// What fails is the event, not the batch: the client retries what the
// server answers as transient (Unavailable and the like) for up to its
// publish timeout. What no retry can fix is permanent (dedup.Permanent),
// failing the row at once: a topic that does not exist (NotFound, which
// fails each event to it), and what Publish checks before sending, so that
// one bad event never fails the request it would share with others: over
// 100 attributes, an attribute name over 256 bytes or value over 1024, a
// header that is not UTF-8, a message the client finds too large
// (pubsub.ErrOversizedMessage), a key over [MaxOrderingKey] bytes. Any
// other error (PermissionDenied, a timeout, InvalidArgument for a whole
// request) is left to the relay's retries.
func (p *Publisher) Publish(ctx context.Context, events []outbox.Event) []error {
	errs := make([]error, len(events))
	results := make([]*pubsub.PublishResult, len(events))
	pubs := make([]*pubsub.Publisher, len(events))
	for i := range events {
		e := &events[i]
		msg, err := message(e)
		if err != nil {
			errs[i] = dedup.Permanent(fmt.Errorf("pubsuboutbox: event %s: %w", e.ID, err))
			continue
		}
		pubs[i] = p.topic(e.Destination)
		results[i] = pubs[i].Publish(ctx, msg)
	}
	failed := map[chainKey]bool{} // keys with an event not stored, to resume
	for i, res := range results {
		if res == nil {
			continue
		}
		e := &events[i]
		_, err := res.Get(ctx)
		if err == nil {
			continue
		}
		key := chainKey{topic: pubs[i], key: orderingKey(e.Key)}
		switch {
		case key.key == "":
			errs[i] = classify(e, err)
		case failed[key]:
			// Refused by the client once the key paused, or sent in the
			// failed request of an earlier event: not stored, and not
			// this event's failure.
			errs[i] = outbox.ErrNotAttempted
		default:
			failed[key] = true
			errs[i] = classify(e, err)
		}
	}
	for k := range failed {
		k.topic.ResumePublish(k.key)
	}
	return errs
}

// chainKey identifies the events the client sends one after the other.
type chainKey struct {
	topic *pubsub.Publisher
	key   string
}

// Stop sends what remains to be sent and stops the publishers of every
// topic used.
func (p *Publisher) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, t := range p.topics {
		t.Stop()
		delete(p.topics, name)
	}
}

// topic returns the publisher of topic name, making it on first use.
func (p *Publisher) topic(name string) *pubsub.Publisher {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.topics[name]
	if !ok {
		t = p.client.Publisher(name)
		t.EnableMessageOrdering = true
		p.topics[name] = t
	}
	return t
}

// classify wraps the error of a publish of e, marking those no retry fixes
// as permanent.
func classify(e *outbox.Event, err error) error {
	err = fmt.Errorf("pubsuboutbox: publish %s to %q: %w", e.ID, e.Destination, err)
	if errors.Is(err, pubsub.ErrOversizedMessage) {
		return dedup.Permanent(err)
	}
	if s, ok := status.FromError(errors.Unwrap(err)); ok && s.Code() == codes.NotFound {
		return dedup.Permanent(err)
	}
	return err
}

// message builds the message of an event, or says why Pub/Sub cannot carry
// it.
func message(e *outbox.Event) (*pubsub.Message, error) {
	if e.Destination == "" {
		return nil, errors.New("empty topic")
	}
	msg := &pubsub.Message{Data: e.Payload, OrderingKey: orderingKey(e.Key), Attributes: map[string]string{}}
	if len(msg.OrderingKey) > MaxOrderingKey {
		return nil, fmt.Errorf("key of %d bytes, over the %d bytes of an ordering key", len(msg.OrderingKey), MaxOrderingKey)
	}
	for _, h := range e.Headers {
		switch {
		case h.Key == IDAttribute || h.Key == TenantAttribute:
			continue // the event's own ID and tenant win
		case !utf8.Valid(h.Value) || !utf8.ValidString(h.Key):
			return nil, fmt.Errorf("header %q is not UTF-8, which a Pub/Sub attribute must be", h.Key)
		case h.Key == "" || len(h.Key) > maxAttributeKey || len(h.Value) > maxAttributeValue:
			return nil, fmt.Errorf("header %q: a Pub/Sub attribute's name has 1 to %d bytes and its value at most %d",
				h.Key, maxAttributeKey, maxAttributeValue)
		}
		msg.Attributes[h.Key] = string(h.Value)
	}
	if len(msg.Attributes) > maxAttributes-2 {
		return nil, fmt.Errorf("%d headers, over the %d attributes of a Pub/Sub message with its ID and tenant", len(msg.Attributes), maxAttributes)
	}
	msg.Attributes[IDAttribute] = e.ID
	if e.Tenant != "" {
		msg.Attributes[TenantAttribute] = e.Tenant
	}
	return msg, nil
}

// orderingKey returns the ordering key of an event's key: the key as it
// is when it is UTF-8, else in standard, padded base64.
func orderingKey(key []byte) string {
	if utf8.Valid(key) {
		return string(key)
	}
	return base64.StdEncoding.EncodeToString(key)
}
