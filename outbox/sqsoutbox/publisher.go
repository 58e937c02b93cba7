// Package sqsoutbox publishes outbox events to Amazon SQS with
// aws-sdk-go-v2: SendMessageBatch of up to ten events, the event's
// destination as queue (URL or name), its ID in the "event-id" message
// attribute, where sqsdedup reads it. On a FIFO queue the key is the message
// group and the event ID the deduplication ID.
//
//	pub, _ := sqsoutbox.NewPublisher(sqsClient)
//	relay, _ := outbox.NewRelay(ob, pgConfig, pub)
//	err := relay.Run(ctx)
package sqsoutbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/sqsbody"
	"github.com/dedupkit/dedup/internal/wire"
	"github.com/dedupkit/dedup/outbox"
)

// TenantAttribute is the message attribute carrying an event's tenant, when
// it has one.
const TenantAttribute = wire.TenantHeader

// DefaultMaxMessageBytes is SQS's classic message size limit, 256 KiB, body
// and attributes together; it also bounds one SendMessageBatch request.
const DefaultMaxMessageBytes = 256 << 10

// maxAttributes is SQS's limit of message attributes per message.
const maxAttributes = 10

// Publisher sends outbox events with an SQS client.
type Publisher struct {
	client   *sqs.Client
	maxBytes int
	urls     sync.Map // queue name -> URL
}

// Opt configures a [Publisher].
type Opt interface{ apply(*Publisher) }

type optFunc func(*Publisher)

func (f optFunc) apply(p *Publisher) { f(p) }

// WithMaxMessageBytes sets the largest message, body and attributes, the
// publisher sends (default [DefaultMaxMessageBytes]; raise it to 1 MiB where
// the queue allows it). A larger event fails with a permanent error.
func WithMaxMessageBytes(n int) Opt { return optFunc(func(p *Publisher) { p.maxBytes = n }) }

// NewPublisher returns a publisher sending with client.
func NewPublisher(client *sqs.Client, opts ...Opt) (*Publisher, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: sqsoutbox: nil client", dedup.ErrConfig)
	}
	p := &Publisher{client: client, maxBytes: DefaultMaxMessageBytes}
	for _, o := range opts {
		o.apply(p)
	}
	if p.maxBytes < 1 {
		return nil, fmt.Errorf("%w: sqsoutbox: max message bytes %d, want at least 1", dedup.ErrConfig, p.maxBytes)
	}
	return p, nil
}

// Publish sends events, queue by queue, in SendMessageBatch calls of at most
// ten. An entry SQS reports as Failed is retried by the relay, unless SQS
// says the sender is at fault; events SQS can never take (over the size
// limit, a body that is not text, a queue that does not exist) fail with a
// permanent error. When SQS refuses a whole call for its entries' content
// (BatchRequestTooLong, InvalidMessageContents, InvalidParameterValue and
// the like), the call is sent again in halves, halved again while refused,
// so that only an entry refused on its own fails, permanently, with SQS's
// reason; other refusals of a call are retried. On a FIFO queue a call
// carries at most one event per message group, and once an event of a group
// fails the group's later events are left unsent (outbox.ErrNotAttempted),
// so that none overtakes it: they go in a later pass.
func (p *Publisher) Publish(ctx context.Context, events []outbox.Event) []error {
	errs := make([]error, len(events))
	byQueue := map[string][]int{}
	var queues []string
	for i, e := range events {
		if _, ok := byQueue[e.Destination]; !ok {
			queues = append(queues, e.Destination)
		}
		byQueue[e.Destination] = append(byQueue[e.Destination], i)
	}
	for _, dest := range queues {
		idx := byQueue[dest]
		url, err := p.queueURL(ctx, dest)
		if err != nil {
			for _, i := range idx {
				errs[i] = err
			}
			continue
		}
		p.publishQueue(ctx, url, events, idx, errs)
	}
	return errs
}

// pendingEntry is an event ready to send.
type pendingEntry struct {
	i     int // in the events
	entry types.SendMessageBatchRequestEntry
	group string
	size  int
}

func (p *Publisher) publishQueue(ctx context.Context, url string, events []outbox.Event, idx []int, errs []error) {
	fifo := strings.HasSuffix(url, ".fifo")
	var todo []pendingEntry
	for _, i := range idx {
		pe, err := p.entry(&events[i], fifo)
		if err != nil {
			errs[i] = dedup.Permanent(fmt.Errorf("sqsoutbox: event %s: %w", events[i].ID, err))
			continue
		}
		pe.i = i
		todo = append(todo, pe)
	}
	blocked := map[string]bool{} // FIFO groups with a failed event
	for len(todo) > 0 {
		call, rest := p.nextCall(todo, fifo, blocked, errs)
		todo = rest
		if len(call) == 0 {
			continue
		}
		p.send(ctx, url, call, errs)
		for _, pe := range call {
			if fifo && errs[pe.i] != nil {
				blocked[pe.group] = true
			}
		}
	}
}

// nextCall picks the entries of the next SendMessageBatch call, in order:
// at most ten, within the size limit, and on a FIFO queue one per group,
// skipping (as not attempted) the groups blocked by a failure.
func (p *Publisher) nextCall(todo []pendingEntry, fifo bool, blocked map[string]bool, errs []error) (call, rest []pendingEntry) {
	seen := map[string]bool{}
	size := 0
	for _, pe := range todo {
		switch {
		case fifo && blocked[pe.group]:
			errs[pe.i] = outbox.ErrNotAttempted
		case len(call) < 10 && size+pe.size <= p.maxBytes && !(fifo && seen[pe.group]):
			pe.entry.Id = aws.String(strconv.Itoa(len(call)))
			call = append(call, pe)
			size += pe.size
			seen[pe.group] = true
		default:
			seen[pe.group] = true
			rest = append(rest, pe)
		}
	}
	return call, rest
}

func (p *Publisher) send(ctx context.Context, url string, call []pendingEntry, errs []error) {
	entries := make([]types.SendMessageBatchRequestEntry, len(call))
	for j, pe := range call {
		entries[j] = pe.entry
	}
	// KeepConnection: an answer thrown away under load would have the SDK
	// send the call again, each of its messages a second time.
	out, err := p.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries},
		sqsbody.KeepConnection)
	if err != nil && refusesEntry(err) {
		if len(call) == 1 {
			errs[call[0].i] = dedup.Permanent(fmt.Errorf("sqsoutbox: send to %s: message of %d bytes refused on its own: %w", url, call[0].size, err))
			return
		}
		half := (len(call) + 1) / 2
		p.send(ctx, url, call[:half], errs)
		p.send(ctx, url, call[half:], errs)
		return
	}
	if err != nil {
		err = classify(url, err)
		for _, pe := range call {
			errs[pe.i] = err
		}
		return
	}
	ok := make(map[string]bool, len(out.Successful))
	for _, s := range out.Successful {
		ok[aws.ToString(s.Id)] = true
	}
	failed := make(map[string]types.BatchResultErrorEntry, len(out.Failed))
	for _, f := range out.Failed {
		failed[aws.ToString(f.Id)] = f
	}
	for _, pe := range call {
		id := aws.ToString(pe.entry.Id)
		if f, bad := failed[id]; bad {
			err := fmt.Errorf("sqsoutbox: send to %s: %s: %s", url, aws.ToString(f.Code), aws.ToString(f.Message))
			if f.SenderFault {
				err = dedup.Permanent(err)
			}
			errs[pe.i] = err
		} else if !ok[id] {
			errs[pe.i] = fmt.Errorf("sqsoutbox: send to %s: entry neither successful nor failed", url)
		}
	}
}

// entry builds the batch entry of an event, or says why SQS cannot take it.
func (p *Publisher) entry(e *outbox.Event, fifo bool) (pendingEntry, error) {
	if !validText(e.Payload) {
		return pendingEntry{}, errors.New("payload is not text SQS accepts (UTF-8 without most control characters); encode it, e.g. as base64")
	}
	attrs := map[string]types.MessageAttributeValue{}
	size := len(e.Payload)
	add := func(name string, value []byte) {
		v := types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(string(value))}
		if !validText(value) {
			v = types.MessageAttributeValue{DataType: aws.String("Binary"), BinaryValue: value}
		}
		attrs[name] = v
		size += len(name) + len(aws.ToString(v.DataType)) + len(value)
	}
	for _, h := range e.Headers {
		if h.Key == wire.SQSIDAttribute || h.Key == TenantAttribute {
			continue // the event's own ID and tenant win
		}
		if !validAttributeName(h.Key) {
			return pendingEntry{}, fmt.Errorf("header %q is not a valid SQS message attribute name", h.Key)
		}
		if len(h.Value) == 0 {
			// SQS refuses an empty attribute value, and with it the
			// whole batch call: the event fails alone instead.
			return pendingEntry{}, fmt.Errorf("header %q has an empty value, which SQS refuses as a message attribute", h.Key)
		}
		add(h.Key, h.Value)
	}
	add(wire.SQSIDAttribute, []byte(e.ID))
	if e.Tenant != "" {
		add(TenantAttribute, []byte(e.Tenant))
	}
	if len(attrs) > maxAttributes {
		return pendingEntry{}, fmt.Errorf("%d message attributes with the event ID, over SQS's %d", len(attrs), maxAttributes)
	}
	if size > p.maxBytes {
		return pendingEntry{}, fmt.Errorf("message of %d bytes (body and attributes), over the limit of %d", size, p.maxBytes)
	}
	pe := pendingEntry{size: size, entry: types.SendMessageBatchRequestEntry{
		MessageBody: aws.String(string(e.Payload)), MessageAttributes: attrs,
	}}
	if fifo {
		pe.group = e.ID // no key, no order to keep
		if len(e.Key) > 0 {
			pe.group = string(e.Key)
		}
		if !validFIFOID(pe.group) {
			return pendingEntry{}, fmt.Errorf("key %q is not a valid MessageGroupId (1-128 ASCII letters, digits, punctuation)", pe.group)
		}
		if !validFIFOID(e.ID) {
			return pendingEntry{}, fmt.Errorf("event ID is not a valid MessageDeduplicationId (1-128 ASCII letters, digits, punctuation)")
		}
		pe.entry.MessageGroupId = aws.String(pe.group)
		pe.entry.MessageDeduplicationId = aws.String(e.ID)
	}
	return pe, nil
}

// queueURL returns dest when it is a URL, or looks the queue name up once.
func (p *Publisher) queueURL(ctx context.Context, dest string) (string, error) {
	if strings.Contains(dest, "://") {
		return dest, nil
	}
	if url, ok := p.urls.Load(dest); ok {
		return url.(string), nil
	}
	out, err := p.client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(dest)})
	if err != nil {
		return "", classify(dest, err)
	}
	url := aws.ToString(out.QueueUrl)
	p.urls.Store(dest, url)
	return url, nil
}

// classify marks a missing queue as permanent; other call errors are
// retried.
func classify(queue string, err error) error {
	err = fmt.Errorf("sqsoutbox: %s: %w", queue, err)
	var qne *types.QueueDoesNotExist
	var api smithy.APIError
	if errors.As(err, &qne) || errors.As(err, &api) && strings.Contains(api.ErrorCode(), "NonExistentQueue") {
		return dedup.Permanent(err)
	}
	return err
}

// entryCodes are the error codes with which SQS refuses a whole
// SendMessageBatch call for what may be one entry in it.
var entryCodes = []string{
	"BatchRequestTooLong", "InvalidMessageContents", "InvalidParameterValue", "InvalidParameterValueException",
	"InvalidAttributeName", "InvalidAttributeValue", "MissingParameter", "BatchEntryIdsNotDistinct",
	"TooManyEntriesInBatchRequest",
}

// refusesEntry reports whether err is a refusal of a SendMessageBatch call
// for its entries' content, rather than for the queue or the request.
func refusesEntry(err error) bool {
	var api smithy.APIError
	return errors.As(err, &api) && slices.Contains(entryCodes, strings.TrimPrefix(api.ErrorCode(), "AWS.SimpleQueueService."))
}

// validText reports whether b is text SQS accepts in a body or a String
// attribute: #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF.
func validText(b []byte) bool {
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n <= 1 {
			return false
		}
		if !(r == 0x9 || r == 0xA || r == 0xD || r >= 0x20 && r <= 0xD7FF || r >= 0xE000 && r <= 0xFFFD || r >= 0x10000) {
			return false
		}
		b = b[n:]
	}
	return true
}

// validAttributeName follows SQS's rule: up to 256 of A-Z a-z 0-9 _ - .,
// no leading, trailing or doubled period, no AWS. or Amazon. prefix.
func validAttributeName(s string) bool {
	if s == "" || len(s) > 256 || s[0] == '.' || s[len(s)-1] == '.' || strings.Contains(s, "..") {
		return false
	}
	l := strings.ToLower(s)
	if strings.HasPrefix(l, "aws.") || strings.HasPrefix(l, "amazon.") {
		return false
	}
	for _, c := range []byte(s) {
		if !(c == '_' || c == '-' || c == '.' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

func validFIFOID(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, c := range []byte(s) {
		if c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}
