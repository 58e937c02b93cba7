package dedup

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dedupkit/dedup/deduptype"
)

// Reason says why a message was dead-lettered.
type Reason = deduptype.Reason

// The reasons a dead letter can carry.
const (
	ReasonHandlerError   = deduptype.ReasonHandlerError
	ReasonPermanent      = deduptype.ReasonPermanent
	ReasonPanic          = deduptype.ReasonPanic
	ReasonCrashLoop      = deduptype.ReasonCrashLoop
	ReasonInvalidID      = deduptype.ReasonInvalidID
	ReasonInvalidPayload = deduptype.ReasonInvalidPayload
	ReasonConflict       = deduptype.ReasonConflict
	// ReasonRedeliveredAfterFinal: see [deduptype.ReasonRedeliveredAfterFinal].
	ReasonRedeliveredAfterFinal = deduptype.ReasonRedeliveredAfterFinal
)

// MetadataPrefix starts the name of every header or attribute dedup adds to
// a dead letter. Existing ones are replaced, never appended, when a message is
// dead-lettered again after a redrive.
const MetadataPrefix = "dedup-"

// Header is one header or attribute of a message.
type Header struct {
	Key   string
	Value []byte
	// Type is the transport's data type of the value where it has one (SQS:
	// String, Number, Binary or a custom type such as Number.float); empty
	// for Kafka and for dedup's metadata, which is text.
	Type string
}

// Origin says where a dead-lettered message came from. Kafka fills Topic,
// Partition, Offset, Group and Timestamp; SQS fills QueueURL and MessageID;
// RabbitMQ fills Queue, Exchange, RoutingKey, DeliveryTag, MessageID and
// Timestamp;
// NATS JetStream fills Topic (the subject), Stream, Offset (the stream
// sequence), Group (the consumer), MessageID and Timestamp.
type Origin struct {
	Topic      string
	Partition  int32
	Offset     int64
	Group      string
	Timestamp  time.Time
	QueueURL   string
	MessageID  string
	Queue      string
	Exchange   string
	RoutingKey string
	// DeliveryTag is RabbitMQ's number of the delivery on its channel.
	DeliveryTag uint64
	Stream      string
}

// LogValue returns the origin for a log line as a group of the coordinates
// its transport names a message by: Kafka's topic, partition, offset and
// group; SQS's queue URL and message ID; RabbitMQ's queue, exchange,
// routing key, delivery tag and message ID; NATS JetStream's stream,
// subject, stream sequence and consumer. Empty fields are left out.
func (o Origin) LogValue() slog.Value {
	var as []slog.Attr
	str := func(key, v string) {
		if v != "" {
			as = append(as, slog.String(key, v))
		}
	}
	switch {
	case o.Stream != "":
		str("stream", o.Stream)
		str("subject", o.Topic)
		as = append(as, slog.Int64("sequence", o.Offset))
		str("consumer", o.Group)
	case o.Topic != "":
		as = append(as, slog.String("topic", o.Topic), slog.Int64("partition", int64(o.Partition)), slog.Int64("offset", o.Offset))
		str("group", o.Group)
	case o.QueueURL != "":
		str("queue_url", o.QueueURL)
	case o.Queue != "":
		as = append(as, slog.String("queue", o.Queue), slog.String("exchange", o.Exchange))
		str("routing_key", o.RoutingKey)
		as = append(as, slog.Uint64("delivery_tag", o.DeliveryTag))
	}
	str("message_id", o.MessageID)
	return slog.GroupValue(as...)
}

// DeadLetter is a message parked because it can never succeed, with why.
type DeadLetter struct {
	// The original message: payload, message key and headers as received.
	Payload    []byte
	MessageKey []byte
	Headers    []Header
	Origin     Origin

	Reason Reason
	// Error is the full error text; Cause is the innermost error's text.
	// ErrorType and CauseType are their Go types, as fmt's %T prints them.
	Error        string
	Cause        string
	ErrorType    string
	CauseType    string
	Attempts     int
	EventID      string
	Scope        string
	FirstFailure time.Time
	LastFailure  time.Time
	// Stack is, for ReasonPanic, the stack of the handler's panic from the
	// frame that panicked, cut at a line to at most 2 KiB; empty otherwise.
	Stack string
}

// Metadata returns the dedup-* headers describing the dead letter; a
// panic's letter has dedup-stack, the stack on one line (its line breaks
// written \n).
func (d *DeadLetter) Metadata() []Header {
	h := []Header{
		{Key: "dedup-reason", Value: []byte(d.Reason)},
		{Key: "dedup-error", Value: []byte(d.Error)},
		{Key: "dedup-cause", Value: []byte(d.Cause)},
		{Key: "dedup-error-type", Value: []byte(d.ErrorType)},
		{Key: "dedup-cause-type", Value: []byte(d.CauseType)},
		{Key: "dedup-attempts", Value: []byte(strconv.Itoa(d.Attempts))},
		{Key: "dedup-event-id", Value: []byte(d.EventID)},
		{Key: "dedup-scope", Value: []byte(d.Scope)},
		{Key: "dedup-first-failure", Value: []byte(formatTime(d.FirstFailure))},
		{Key: "dedup-last-failure", Value: []byte(formatTime(d.LastFailure))},
	}
	if d.Stack != "" {
		h = append(h, Header{Key: "dedup-stack", Value: []byte(oneLine(d.Stack))})
	}
	o := d.Origin
	if o.Topic != "" {
		h = append(h,
			Header{Key: "dedup-origin-topic", Value: []byte(o.Topic)},
			Header{Key: "dedup-origin-partition", Value: []byte(strconv.FormatInt(int64(o.Partition), 10))},
			Header{Key: "dedup-origin-offset", Value: []byte(strconv.FormatInt(o.Offset, 10))},
			Header{Key: "dedup-origin-group", Value: []byte(o.Group)},
		)
		if !o.Timestamp.IsZero() {
			h = append(h, Header{Key: "dedup-origin-timestamp", Value: []byte(formatTime(o.Timestamp))})
		}
	}
	if o.Stream != "" {
		h = append(h,
			Header{Key: "dedup-origin-stream", Value: []byte(o.Stream)},
			Header{Key: "dedup-origin-message-id", Value: []byte(o.MessageID)},
		)
	}
	if o.QueueURL != "" {
		h = append(h,
			Header{Key: "dedup-origin-queue", Value: []byte(o.QueueURL)},
			Header{Key: "dedup-origin-message-id", Value: []byte(o.MessageID)},
		)
	}
	if o.Queue != "" {
		h = append(h,
			Header{Key: "dedup-origin-queue", Value: []byte(o.Queue)},
			Header{Key: "dedup-origin-exchange", Value: []byte(o.Exchange)},
			Header{Key: "dedup-origin-routing-key", Value: []byte(o.RoutingKey)},
			Header{Key: "dedup-origin-delivery-tag", Value: []byte(strconv.FormatUint(o.DeliveryTag, 10))},
			Header{Key: "dedup-origin-message-id", Value: []byte(o.MessageID)},
		)
		if !o.Timestamp.IsZero() {
			h = append(h, Header{Key: "dedup-origin-timestamp", Value: []byte(formatTime(o.Timestamp))})
		}
	}
	return h
}

// HeadersWithMetadata returns the original headers without any earlier
// dedup-* headers, followed by this dead letter's metadata.
func (d *DeadLetter) HeadersWithMetadata() []Header {
	meta := d.Metadata()
	out := make([]Header, 0, len(d.Headers)+len(meta))
	for _, h := range d.Headers {
		if !strings.HasPrefix(h.Key, MetadataPrefix) {
			out = append(out, h)
		}
	}
	return append(out, meta...)
}

// oneLine returns s on one line, as a header value must be on every
// transport (a NATS header ends at a line break): a backslash, a line feed
// and a carriage return are written \\, \n and \r.
func oneLine(s string) string {
	return strings.NewReplacer("\\", "\\\\", "\n", "\\n", "\r", "\\r").Replace(s)
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// rootCause returns the innermost error of a wrap chain; for a joined error
// it follows the first branch.
func rootCause(err error) error {
	for {
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			next := u.Unwrap()
			if next == nil {
				return err
			}
			err = next
		case interface{ Unwrap() []error }:
			errs := u.Unwrap()
			if len(errs) == 0 || errs[0] == nil {
				return err
			}
			err = errs[0]
		default:
			return err
		}
	}
}

// Sink parks dead letters. Send must return only once the letter is durable:
// the original is acknowledged after Send returns nil, never before.
type Sink interface {
	Send(ctx context.Context, dl DeadLetter) error
}

// MemorySink keeps dead letters in memory, for tests and examples.
type MemorySink struct {
	mu      sync.Mutex
	letters []DeadLetter
}

// NewMemorySink returns an empty MemorySink.
func NewMemorySink() *MemorySink { return &MemorySink{} }

// Send appends dl.
func (s *MemorySink) Send(_ context.Context, dl DeadLetter) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.letters = append(s.letters, dl)
	return nil
}

// Letters returns a copy of the dead letters sent so far.
func (s *MemorySink) Letters() []DeadLetter {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]DeadLetter(nil), s.letters...)
}

// originOf is a message's origin for a log line: the transport's dead letter
// of it is built only when a handler writes the line.
type originOf[M any] struct {
	deadLetter func(M) DeadLetter
	msg        M
	group      string // the call's consumer group, where the message does not say
}

// LogValue returns the message's [Origin.LogValue].
func (o originOf[M]) LogValue() slog.Value {
	origin := o.deadLetter(o.msg).Origin
	if origin.Group == "" {
		origin.Group = o.group
	}
	return origin.LogValue()
}

// origin returns the "origin" attribute of d's message, built lazily.
func (w *Wrapper[M]) origin(d *delivery[M]) slog.Attr {
	o := originOf[M]{deadLetter: w.msgs.DeadLetter, msg: d.msg}
	if d.call != nil {
		o.group = d.call.group
	}
	return slog.Any("origin", o)
}
