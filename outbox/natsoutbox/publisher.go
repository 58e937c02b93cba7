// Package natsoutbox publishes outbox events to NATS JetStream: one message
// per event, with the event's destination as subject, its ID in the
// "Nats-Msg-Id" header, where natsdedup reads it, and its key in the
// "event-key" header ([KeyHeader], or [KeyBase64Header] for a key that is
// not plain text). A relay that publishes an event again within the
// stream's duplicate window (it died before marking the row sent) is
// absorbed by the server itself; a later copy, by the consumer's wrapper.
//
//	pub, _ := natsoutbox.NewPublisher(js)
//	relay, _ := outbox.NewRelay(ob, pgConfig, pub)
//	err := relay.Run(ctx)
package natsoutbox

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/group"
	"github.com/dedupkit/dedup/internal/wire"
	"github.com/dedupkit/dedup/outbox"
)

// TenantHeader is the header carrying an event's tenant, when it has one.
const TenantHeader = wire.TenantHeader

// KeyHeader is the header carrying an event's key (outbox.Event.Key) as it
// is, when it has one and the key is text a NATS header keeps unchanged:
// UTF-8 without control characters and without a space at either end. A
// header of this name among the event's headers is not sent.
const KeyHeader = "event-key"

// KeyBase64Header is the header carrying an event's key in standard, padded
// base64 instead of [KeyHeader], when the key is not such text. A header of
// this name among the event's headers is not sent.
const KeyBase64Header = "event-key-base64"

// DefaultConcurrency is how many keys a Publisher publishes at once unless
// [WithConcurrency] says otherwise.
const DefaultConcurrency = 64

// ErrNoStream is matched by the (permanent) error of an event whose subject
// no stream captures, as the JetStream API confirmed.
var ErrNoStream = errors.New("natsoutbox: no stream captures the subject")

// Publisher publishes outbox events with a jetstream.JetStream.
type Publisher struct {
	js          jetstream.JetStream
	concurrency int
}

// Opt configures a [Publisher].
type Opt interface{ apply(*Publisher) }

type optFunc func(*Publisher)

func (f optFunc) apply(p *Publisher) { f(p) }

// WithConcurrency sets how many keys (and events without a key) are
// published at once (default 64); the events of one key are always
// published one after the other.
func WithConcurrency(n int) Opt { return optFunc(func(p *Publisher) { p.concurrency = n }) }

// NewPublisher returns a publisher publishing with js, whose connection it
// does not close.
func NewPublisher(js jetstream.JetStream, opts ...Opt) (*Publisher, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: natsoutbox: nil JetStream", dedup.ErrConfig)
	}
	p := &Publisher{js: js, concurrency: DefaultConcurrency}
	for _, o := range opts {
		o.apply(p)
	}
	if p.concurrency < 1 {
		return nil, fmt.Errorf("%w: natsoutbox: WithConcurrency(%d): must be at least 1", dedup.ErrConfig, p.concurrency)
	}
	return p, nil
}

// Publish publishes events and reports each one's result once the stream
// acknowledged it (an acknowledgement of a duplicate within the stream's
// window included). The events of one destination and key are published one
// after the other, each once the previous one is acknowledged; once one
// fails for a reason worth retrying, the later ones of its key are left
// unsent (outbox.ErrNotAttempted), so that none overtakes it. Different keys,
// and events without a key, are published concurrently.
//
// Errors no retry can fix are permanent (dedup.Permanent), failing the row
// at once: a subject that is not a valid publish subject, a header name
// NATS cannot carry, a message over the server's max_payload or the
// stream's max_msg_size, and a subject no stream captures ([ErrNoStream]):
// when the server answers a publish with no responders, Publish asks the
// JetStream API which stream captures the subject, and only an answer of
// none makes the error permanent; no answer at all (JetStream restarting,
// a leader being elected) leaves it to be retried.
func (p *Publisher) Publish(ctx context.Context, events []outbox.Event) []error {
	errs := make([]error, len(events))
	idx := make([]int, len(events))
	for i := range idx {
		idx[i] = i
	}
	chains := group.By(idx, func(i int) chainKey {
		if e := &events[i]; len(e.Key) > 0 {
			return chainKey{destination: e.Destination, key: string(e.Key)}
		}
		return chainKey{alone: i + 1}
	})
	sem := make(chan struct{}, p.concurrency)
	var wg sync.WaitGroup
	for _, chain := range chains {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			p.publishChain(ctx, events, chain, errs)
		})
	}
	wg.Wait()
	return errs
}

// chainKey identifies the events published one after the other: those of
// one destination and key. An event without a key is alone in its chain:
// alone is its index plus one.
type chainKey struct {
	destination, key string
	alone            int
}

// publishChain publishes the events at idx, of one key, in order.
func (p *Publisher) publishChain(ctx context.Context, events []outbox.Event, idx []int, errs []error) {
	held := false
	for _, i := range idx {
		if held {
			errs[i] = outbox.ErrNotAttempted
			continue
		}
		errs[i] = p.publish(ctx, &events[i])
		if errs[i] != nil && !dedup.IsPermanent(errs[i]) {
			held = true
		}
	}
}

// publish publishes one event and waits for the stream's acknowledgement.
func (p *Publisher) publish(ctx context.Context, e *outbox.Event) error {
	msg, err := message(e)
	if err != nil {
		return dedup.Permanent(fmt.Errorf("natsoutbox: event %s: %w", e.ID, err))
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("natsoutbox: event %s not sent: %w", e.ID, context.Cause(ctx))
	}
	_, err = p.js.PublishMsg(ctx, msg, jetstream.WithMsgID(e.ID))
	if err == nil {
		return nil
	}
	return p.classify(ctx, e, err)
}

// classify wraps the error of a publish of e, marking those no retry fixes
// as permanent.
func (p *Publisher) classify(ctx context.Context, e *outbox.Event, err error) error {
	err = fmt.Errorf("natsoutbox: publish %s to %q: %w", e.ID, e.Destination, err)
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, nats.ErrMaxPayload), errors.Is(err, nats.ErrBadSubject), errors.Is(err, nats.ErrBadHeaderMsg):
		return dedup.Permanent(err)
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return dedup.Permanent(err)
	case errors.Is(err, jetstream.ErrNoStreamResponse) && ctx.Err() == nil:
		_, lookup := p.js.StreamNameBySubject(ctx, e.Destination)
		if errors.Is(lookup, jetstream.ErrStreamNotFound) {
			return dedup.Permanent(fmt.Errorf("%w: %w", ErrNoStream, err))
		}
	}
	return err
}

// message builds the message of an event, or says why NATS cannot carry it.
func message(e *outbox.Event) (*nats.Msg, error) {
	if err := checkSubject(e.Destination); err != nil {
		return nil, err
	}
	msg := &nats.Msg{Subject: e.Destination, Data: e.Payload, Header: nats.Header{}}
	for _, h := range e.Headers {
		switch h.Key {
		case wire.NATSIDHeader, TenantHeader, KeyHeader, KeyBase64Header:
			continue // the event's own ID, tenant and key win
		}
		if !validHeaderName(h.Key) {
			return nil, fmt.Errorf("header name %q cannot be carried by NATS (no spaces, colons or control characters)", h.Key)
		}
		msg.Header.Add(h.Key, string(h.Value))
	}
	if e.Tenant != "" {
		msg.Header.Set(TenantHeader, e.Tenant)
	}
	switch {
	case len(e.Key) == 0:
	case plainText(e.Key):
		msg.Header.Set(KeyHeader, string(e.Key))
	default:
		msg.Header.Set(KeyBase64Header, base64.StdEncoding.EncodeToString(e.Key))
	}
	return msg, nil // the event ID goes in with jetstream.WithMsgID
}

// checkSubject returns why s cannot be published to: empty, an empty
// token, whitespace, or a wildcard.
func checkSubject(s string) error {
	if s == "" {
		return errors.New("empty subject")
	}
	for _, tok := range strings.Split(s, ".") {
		switch {
		case tok == "":
			return fmt.Errorf("subject %q has an empty token", s)
		case tok == "*" || tok == ">":
			return fmt.Errorf("subject %q has a wildcard, which no message can be published to", s)
		case strings.ContainsAny(tok, " \t\r\n"):
			return fmt.Errorf("subject %q contains whitespace", s)
		}
	}
	return nil
}

// plainText reports whether b is a header value NATS carries unchanged:
// UTF-8 without control characters, and no space at either end (a reader
// trims it).
func plainText(b []byte) bool {
	if !utf8.Valid(b) || len(bytes.TrimSpace(b)) != len(b) {
		return false
	}
	return !bytes.ContainsFunc(b, unicode.IsControl)
}

// validHeaderName follows NATS: printable ASCII without spaces or colons.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c == ':' || c > '~' {
			return false
		}
	}
	return true
}
