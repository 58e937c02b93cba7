package sqsdedup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/sqsbody"
)

const (
	// DefaultMaxMessageSize is the dead-letter size limit a [Sink] enforces
	// unless told otherwise: 256 KiB, which every SQS queue accepts unless
	// configured lower.
	DefaultMaxMessageSize = 256 << 10
	// MetadataAttribute is the single attribute that carries the dedup-*
	// metadata, as a JSON object, when it does not fit in separate attributes.
	MetadataAttribute = "dedup-metadata"
	// maxAttributes is SQS's limit of message attributes per message.
	maxAttributes = 10
)

// ErrTooManyAttributes means a dead letter's original attributes leave no
// room under SQS's limit of 10 for the dedup metadata. The original message
// is left in its queue: give that queue a redrive policy as a backstop.
var ErrTooManyAttributes = errors.New("sqsdedup: too many message attributes for a dead letter")

// TooLargeError means a dead letter, body plus attributes, exceeds the DLQ's
// message size limit. The original message is left in its queue.
type TooLargeError struct {
	Size  int
	Limit int
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("sqsdedup: dead letter is %d bytes, over the DLQ's limit of %d", e.Size, e.Limit)
}

// SinkOpt configures a [Sink].
type SinkOpt interface{ apply(*Sink) }

type sinkOptFunc func(*Sink)

func (f sinkOptFunc) apply(x *Sink) { f(x) }

// WithMaxMessageSize sets the DLQ's size limit in bytes, body plus
// attributes (default 256 KiB). Queues may be configured from 1 KiB up to
// 1 MiB.
func WithMaxMessageSize(n int) SinkOpt { return sinkOptFunc(func(s *Sink) { s.maxSize = n }) }

// Sink is a dedup.Sink that sends dead letters to an SQS queue.
//
// A dead letter keeps the original body and message attributes and adds the
// dedup-* metadata (see dedup.DeadLetter.Metadata): as separate String
// attributes when all fit in SQS's limit of 10 attributes, otherwise (as
// always for a message from SQS, whose origin adds two) packed as one JSON
// object in the "dedup-metadata" attribute; read either form back with
// [DeadLetterMetadata]. Metadata from an earlier dead-lettering is
// replaced, not kept. An original attribute is never dropped: when the
// original already has 10, Send fails with [ErrTooManyAttributes] rather than
// park the message without saying why; so it does for an attribute SQS
// cannot carry (an empty value, a name repeated) and for a payload that is
// not SQS text, such as a binary one from another transport. Original values that are valid SQS
// text are sent as String attributes, others as Binary: the sink sees no
// data types, so a Number attribute arrives as a String.
//
// On a FIFO DLQ, the MessageGroupId is the original's (its message key), else
// the event ID, so that one group's letters stay in order; the
// MessageDeduplicationId is derived from the scope, event ID and origin, so
// that a letter sent again after a failed acknowledgement is dropped by SQS
// within its 5-minute deduplication window.
type Sink struct {
	client  *sqs.Client
	url     string
	fifo    bool
	maxSize int
}

// NewSink returns a Sink sending to the queue at queueURL.
func NewSink(client *sqs.Client, queueURL string, opts ...SinkOpt) (*Sink, error) {
	s := &Sink{client: client, url: queueURL, fifo: isFIFO(queueURL), maxSize: DefaultMaxMessageSize}
	for _, o := range opts {
		o.apply(s)
	}
	if err := s.validate(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Sink) validate() error {
	switch {
	case s.client == nil:
		return fmt.Errorf("%w: sqsdedup sink: nil SQS client", dedup.ErrConfig)
	case checkQueueURL(s.url) != nil:
		return fmt.Errorf("%w: sqsdedup sink: %v", dedup.ErrConfig, checkQueueURL(s.url))
	case s.maxSize < 1:
		return fmt.Errorf("%w: sqsdedup sink: WithMaxMessageSize(%d): must be positive", dedup.ErrConfig, s.maxSize)
	}
	return nil
}

func isFIFO(queueURL string) bool { return strings.HasSuffix(queueURL, ".fifo") }

// checkQueueURL reports what makes queueURL unusable as a queue URL, which
// SQS APIs take as an absolute http or https URL naming account and queue.
func checkQueueURL(queueURL string) error {
	if queueURL == "" {
		return errors.New("empty queue URL")
	}
	u, err := url.Parse(queueURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.Trim(u.Path, "/") == "" {
		return fmt.Errorf("queue URL %q is not an http(s) URL with a queue path, such as https://sqs.us-east-1.amazonaws.com/123456789012/orders", queueURL)
	}
	return nil
}

// Send sends dl to the DLQ and returns once SQS has stored it. A Sink not
// made by NewSink fails with dedup.ErrConfig.
func (s *Sink) Send(ctx context.Context, dl dedup.DeadLetter) error {
	if err := s.validate(); err != nil {
		return err
	}
	in, err := s.input(&dl)
	if err != nil {
		return fmt.Errorf("sqsdedup: dead letter %s/%s for %s: %w", dl.Scope, dl.EventID, s.url, err)
	}
	if _, err := s.client.SendMessage(ctx, in, sqsbody.KeepConnection); err != nil {
		return fmt.Errorf("sqsdedup: send dead letter %s/%s to %s: %w", dl.Scope, dl.EventID, s.url, err)
	}
	return nil
}

func (s *Sink) input(dl *dedup.DeadLetter) (*sqs.SendMessageInput, error) {
	// The SDK would send invalid UTF-8 with each bad byte replaced, and SQS
	// refuses the other characters sqsText replaces: a binary payload (from
	// another transport) cannot be parked here unchanged.
	if body := string(dl.Payload); sqsText(body) != body {
		return nil, errors.New("the payload is not text SQS can carry")
	}
	attrs := make(map[string]types.MessageAttributeValue, maxAttributes)
	for _, h := range dl.Headers {
		if strings.HasPrefix(h.Key, dedup.MetadataPrefix) {
			continue
		}
		if len(h.Value) == 0 {
			return nil, fmt.Errorf("attribute %q is empty, which SQS cannot carry", h.Key)
		}
		if _, dup := attrs[h.Key]; dup {
			// Kafka headers may repeat a name; SQS attributes may not.
			return nil, fmt.Errorf("attribute %q appears twice, which SQS cannot carry", h.Key)
		}
		attrs[h.Key] = originalAttribute(h)
	}
	if len(attrs) >= maxAttributes {
		return nil, fmt.Errorf("%w: the original has %d, leaving no room for the metadata", ErrTooManyAttributes, len(attrs))
	}
	if err := addMetadata(attrs, dl.Metadata()); err != nil {
		return nil, err
	}
	size := len(dl.Payload)
	for name, v := range attrs {
		size += len(name) + len(aws.ToString(v.DataType)) + len(aws.ToString(v.StringValue)) + len(v.BinaryValue)
	}
	if size > s.maxSize {
		return nil, &TooLargeError{Size: size, Limit: s.maxSize}
	}
	in := &sqs.SendMessageInput{
		QueueUrl:          aws.String(s.url),
		MessageBody:       aws.String(string(dl.Payload)),
		MessageAttributes: attrs,
	}
	if s.fifo {
		in.MessageGroupId = aws.String(groupID(dl))
		in.MessageDeduplicationId = aws.String(deduplicationID(dl))
	}
	return in, nil
}

// addMetadata adds meta as separate attributes when they fit, else as one.
func addMetadata(attrs map[string]types.MessageAttributeValue, meta []dedup.Header) error {
	nonEmpty := 0
	for _, h := range meta {
		if len(h.Value) > 0 {
			nonEmpty++
		}
	}
	if len(attrs)+nonEmpty <= maxAttributes {
		for _, h := range meta {
			if len(h.Value) > 0 { // SQS refuses empty attribute values
				attrs[h.Key] = stringAttribute(sqsText(string(h.Value)))
			}
		}
		return nil
	}
	obj := make(map[string]string, len(meta))
	for _, h := range meta {
		obj[h.Key] = string(h.Value)
	}
	packed, err := json.Marshal(obj)
	if err != nil {
		return fmt.Errorf("pack metadata: %w", err)
	}
	attrs[MetadataAttribute] = stringAttribute(sqsText(string(packed)))
	return nil
}

func stringAttribute(s string) types.MessageAttributeValue {
	return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(s)}
}

// originalAttribute restores an original attribute with its data type; one
// without a type (from another transport) is String when SQS accepts it as
// text, else Binary.
func originalAttribute(h dedup.Header) types.MessageAttributeValue {
	switch {
	case strings.HasPrefix(h.Type, "Binary"):
		return types.MessageAttributeValue{DataType: aws.String(h.Type), BinaryValue: h.Value}
	case h.Type != "":
		return types.MessageAttributeValue{DataType: aws.String(h.Type), StringValue: aws.String(string(h.Value))}
	}
	if s := string(h.Value); sqsText(s) == s {
		return stringAttribute(s)
	}
	return types.MessageAttributeValue{DataType: aws.String("Binary"), BinaryValue: h.Value}
}

// sqsText replaces what SQS refuses in text (most control characters,
// U+FFFE, U+FFFF, invalid UTF-8) with U+FFFD.
func sqsText(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == '\t' || r == '\n' || r == '\r',
			r >= 0x20 && r <= 0xD7FF,
			r >= 0xE000 && r <= 0xFFFD,
			r >= 0x10000 && r <= 0x10FFFF:
			return r
		}
		return utf8.RuneError
	}, s)
}

// groupID keeps a FIFO origin's group, else groups by event ID.
func groupID(dl *dedup.DeadLetter) string {
	id := string(dl.MessageKey)
	if id == "" {
		id = dl.EventID
	}
	if id == "" {
		id = dl.Origin.MessageID
	}
	if validFIFOID(id) {
		return id
	}
	return hashID(id)
}

func deduplicationID(dl *dedup.DeadLetter) string {
	o := dl.Origin
	return hashID(dl.Scope, dl.EventID, o.QueueURL, o.MessageID, o.Topic,
		strconv.FormatInt(int64(o.Partition), 10), strconv.FormatInt(o.Offset, 10))
}

func hashID(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// validFIFOID reports whether s can be a MessageGroupId: 1 to 128 ASCII
// letters, digits and punctuation.
func validFIFOID(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// DeadLetterMetadata returns the dedup-* metadata of a message received from
// a DLQ that a [Sink] wrote, from separate attributes or the packed
// "dedup-metadata" attribute, keyed by attribute name ("dedup-reason", ...).
func DeadLetterMetadata(m types.Message) (map[string]string, error) {
	meta := make(map[string]string)
	for name, v := range m.MessageAttributes {
		if strings.HasPrefix(name, dedup.MetadataPrefix) && name != MetadataAttribute {
			meta[name] = aws.ToString(v.StringValue)
		}
	}
	if v, ok := m.MessageAttributes[MetadataAttribute]; ok {
		if err := json.Unmarshal([]byte(aws.ToString(v.StringValue)), &meta); err != nil {
			return nil, fmt.Errorf("sqsdedup: malformed %s attribute of message %s: %w", MetadataAttribute, aws.ToString(m.MessageId), err)
		}
	}
	return meta, nil
}
