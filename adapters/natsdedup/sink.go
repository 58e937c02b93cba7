package natsdedup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
)

// ErrNoDLQSubject is returned by [Sink.Send] when no dead-letter subject can
// be named for a letter (one without an origin subject, under the default
// naming).
var ErrNoDLQSubject = errors.New("natsdedup: no dead-letter subject for this letter")

// ErrNoDLQStream is matched by the error of [Sink.Send] when no stream
// captures the dead-letter subject: the server stored nothing. That error,
// which names the subject, also matches jetstream.ErrNoStreamResponse.
var ErrNoDLQStream = errors.New("natsdedup: no stream captures the dead-letter subject")

// DefaultDLQPrefix starts the dead-letter subject of a letter unless
// [WithDLQSubject] names another: "dlq." followed by the origin subject.
const DefaultDLQPrefix = "dlq."

// Sink is a dedup.Sink that publishes dead letters to a JetStream stream
// and waits for the stream's acknowledgement, so that a letter is stored
// before the wrapper records the event as dead-lettered and the original
// is terminated. A stream must capture the dead-letter subjects (by
// default "dlq.>").
//
// A letter carries the original data and headers, except the Nats-*
// headers JetStream would act on when publishing (the original message ID
// travels as dedup-origin-message-id), followed by the dedup-* metadata
// (dedup.DeadLetter.HeadersWithMetadata; metadata from an earlier
// dead-lettering is replaced). Its own Nats-Msg-Id is derived from the
// scope, event ID and origin (stream and sequence), so that a letter sent
// again, after a failure to record it, is dropped by the dead-letter
// stream within its duplicate window.
type Sink struct {
	js      jetstream.JetStream
	subject func(origin string) string
}

// SinkOpt configures a [Sink].
type SinkOpt interface{ apply(*Sink) }

type sinkOptFunc func(*Sink)

func (f sinkOptFunc) apply(x *Sink) { f(x) }

// WithDLQSubject names the dead-letter subject of a letter from its origin
// subject; the default is "dlq." + origin. Returning "" refuses the letter
// with [ErrNoDLQSubject].
func WithDLQSubject(f func(origin string) string) SinkOpt {
	return sinkOptFunc(func(s *Sink) { s.subject = f })
}

// NewSink returns a Sink publishing with js, whose connection the caller
// owns and closes.
func NewSink(js jetstream.JetStream, opts ...SinkOpt) (*Sink, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: natsdedup.NewSink: nil JetStream", dedup.ErrConfig)
	}
	s := &Sink{js: js, subject: defaultDLQSubject}
	for _, o := range opts {
		o.apply(s)
	}
	if s.subject == nil {
		return nil, fmt.Errorf("%w: natsdedup.WithDLQSubject: nil function", dedup.ErrConfig)
	}
	return s, nil
}

func defaultDLQSubject(origin string) string {
	if origin == "" {
		return ""
	}
	return DefaultDLQPrefix + origin
}

// Send publishes dl and returns nil once the dead-letter stream has stored
// it (or had already stored it: a duplicate within its window).
func (s *Sink) Send(ctx context.Context, dl dedup.DeadLetter) error {
	subject := s.subject(dl.Origin.Topic)
	if subject == "" {
		return fmt.Errorf("%w: %s/%s from subject %q", ErrNoDLQSubject, dl.Scope, dl.EventID, dl.Origin.Topic)
	}
	msg := &nats.Msg{Subject: subject, Data: dl.Payload, Header: nats.Header{}}
	for _, h := range dl.HeadersWithMetadata() {
		if strings.HasPrefix(strings.ToLower(h.Key), "nats-") {
			continue // JetStream acts on these when publishing
		}
		msg.Header.Add(h.Key, string(h.Value))
	}
	_, err := s.js.PublishMsg(ctx, msg, jetstream.WithMsgID(letterID(&dl)))
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("natsdedup: dead letter %s/%s to %s: %w (%w)", dl.Scope, dl.EventID, subject, ErrNoDLQStream, err)
	case err != nil:
		return fmt.Errorf("natsdedup: dead letter %s/%s to %s: %w", dl.Scope, dl.EventID, subject, err)
	}
	return nil
}

// letterID identifies one dead-lettering of one delivered message.
func letterID(dl *dedup.DeadLetter) string {
	o := dl.Origin
	h := sha256.New()
	for _, p := range []string{dl.Scope, dl.EventID, o.Stream, o.Topic, strconv.FormatInt(o.Offset, 10)} {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return "dl-" + hex.EncodeToString(h.Sum(nil)[:16])
}
