package pubsubdedup

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupkit/dedup"
)

// Attributes a [Sink] adds to a letter for its origin, beside the dedup-*
// metadata of dedup.DeadLetter.Metadata (and [OriginMessageIDAttribute]).
const (
	// OriginSubscriptionAttribute names the subscription the message was
	// received from.
	OriginSubscriptionAttribute = dedup.MetadataPrefix + "origin-subscription"
	// OriginPublishTimeAttribute is the original's publish time, RFC 3339
	// with nanoseconds, UTC.
	OriginPublishTimeAttribute = dedup.MetadataPrefix + "origin-publish-time"
)

// MaxAttributeValue is the most bytes Pub/Sub takes in an attribute value:
// a longer metadata value (an error's text, a panic's stack) is cut to it,
// at a character boundary.
const MaxAttributeValue = 1024

// Sink is a dedup.Sink that publishes dead letters to a Pub/Sub topic and
// waits for the server's answer, so that a letter is stored before the
// wrapper records the event as dead-lettered and the original is
// acknowledged.
//
// A letter carries the original data and attributes, followed by the
// dedup-* metadata as attributes (dedup.DeadLetter.HeadersWithMetadata;
// metadata from an earlier dead-lettering is replaced), and the origin:
// [OriginMessageIDAttribute], [OriginSubscriptionAttribute] and
// [OriginPublishTimeAttribute]. It keeps the original's ordering key, so
// that the letters of one key are in order on an ordered subscription of
// the dead-letter topic. The Sink's publisher has message ordering on;
// after a letter with an ordering key failed, the client refuses that key
// until resumed, which Send does, so a letter sent again is published.
//
// A letter's attributes keep within Pub/Sub's limits ([MaxAttributeValue]);
// its body is not cut: a letter of an original near Pub/Sub's 10 MB, which
// the metadata pushes over it, is refused, Send fails and the message is
// not acknowledged.
type Sink struct {
	pub   *pubsub.Publisher
	topic string
}

// NewSink returns a Sink publishing to topic (an ID in client's project, or
// a full name "projects/P/topics/T") with client, which the caller owns and
// closes after [Sink.Stop].
func NewSink(client *pubsub.Client, topic string) (*Sink, error) {
	switch {
	case client == nil:
		return nil, fmt.Errorf("%w: pubsubdedup.NewSink: nil client", dedup.ErrConfig)
	case topic == "":
		return nil, fmt.Errorf("%w: pubsubdedup.NewSink: empty topic", dedup.ErrConfig)
	}
	pub := client.Publisher(topic)
	pub.EnableMessageOrdering = true
	pub.PublishSettings.DelayThreshold = time.Millisecond // a letter is waited for: send it at once
	return &Sink{pub: pub, topic: pub.String()}, nil
}

// Send publishes dl and returns nil once the server has stored it.
func (s *Sink) Send(ctx context.Context, dl dedup.DeadLetter) error {
	msg := &pubsub.Message{Data: dl.Payload, OrderingKey: string(dl.MessageKey), Attributes: map[string]string{}}
	for _, h := range dl.HeadersWithMetadata() {
		msg.Attributes[h.Key] = cut(string(h.Value))
	}
	o := dl.Origin
	msg.Attributes[OriginMessageIDAttribute] = o.MessageID
	if o.Group != "" {
		msg.Attributes[OriginSubscriptionAttribute] = o.Group
	}
	if !o.Timestamp.IsZero() {
		msg.Attributes[OriginPublishTimeAttribute] = o.Timestamp.UTC().Format(time.RFC3339Nano)
	}
	if _, err := s.pub.Publish(ctx, msg).Get(ctx); err != nil {
		if msg.OrderingKey != "" {
			s.pub.ResumePublish(msg.OrderingKey)
		}
		return fmt.Errorf("pubsubdedup: dead letter %s/%s to %s: %w", dl.Scope, dl.EventID, s.topic, err)
	}
	return nil
}

// Stop sends what remains to be sent and stops the Sink's publisher.
func (s *Sink) Stop() { s.pub.Stop() }

// cut returns v cut to MaxAttributeValue bytes at a character boundary.
func cut(v string) string {
	if len(v) <= MaxAttributeValue {
		return v
	}
	n := MaxAttributeValue
	for n > 0 && !utf8.RuneStart(v[n]) {
		n--
	}
	return v[:n]
}
