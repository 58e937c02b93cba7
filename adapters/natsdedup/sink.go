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

// TruncatedHeader is the header of a letter whose body was cut because the
// whole letter was too large to be stored (see [Sink.Send]): its value is
// the original body's size in bytes. The original message stays in its
// stream, at the sequence the letter's dedup-origin-offset gives, unless
// the stream's limits removed it.
const TruncatedHeader = "dedup-truncated"

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
// stream within its duplicate window. A letter too large to be stored has
// its body cut ([TruncatedHeader]): one poison message is never an outage
// of the sink.
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
// it (or had already stored it: a duplicate within its window). A letter
// too large for the server's max_payload or the stream's MaxMsgSize (its
// metadata added to a message just under the limit) would be refused
// forever: it is sent again with its body cut, to what fits under
// max_payload or else to nothing, and a [TruncatedHeader] giving the
// original body's size, so that the message is settled all the same.
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
	msg.Header.Set(jetstream.MsgIDHeader, letterID(&dl))
	err := s.publish(ctx, msg)
	if tooLarge(err) {
		msg.Header.Set(TruncatedHeader, strconv.Itoa(len(dl.Payload)))
		room := s.js.Conn().MaxPayload() - int64(msg.Size()-len(msg.Subject)-len(msg.Data))
		for _, n := range []int64{room, 0} {
			if n < 0 || n >= int64(len(msg.Data)) {
				continue
			}
			msg.Data = msg.Data[:n]
			if err = s.publish(ctx, msg); !tooLarge(err) {
				break
			}
		}
	}
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("natsdedup: dead letter %s/%s to %s: %w (%w)", dl.Scope, dl.EventID, subject, ErrNoDLQStream, err)
	case err != nil:
		return fmt.Errorf("natsdedup: dead letter %s/%s to %s: %w", dl.Scope, dl.EventID, subject, err)
	}
	return nil
}

func (s *Sink) publish(ctx context.Context, msg *nats.Msg) error {
	_, err := s.js.PublishMsg(ctx, msg)
	return err
}

// tooLarge reports whether err is the refusal of a message for its size:
// by the client, before sending, over the server's max_payload, or by the
// stream, over its MaxMsgSize.
func tooLarge(err error) bool {
	return errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum)
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
