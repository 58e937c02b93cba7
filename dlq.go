package dedup

import (
	"context"
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
// RabbitMQ fills Queue, Exchange, RoutingKey, MessageID and Timestamp;
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
	Stream     string
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
