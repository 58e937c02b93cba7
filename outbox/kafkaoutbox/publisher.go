// Package kafkaoutbox publishes outbox events to Kafka with franz-go: one
// record per event, with the event's destination as topic, its key as record
// key, and its ID in the "event-id" header, where kafkadedup reads it.
//
//	pub, _ := kafkaoutbox.NewPublisher(client)
//	relay, _ := outbox.NewRelay(ob, pgConfig, pub)
//	err := relay.Run(ctx)
package kafkaoutbox

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/wire"
	"github.com/dedupkit/dedup/outbox"
)

// TenantHeader is the header carrying an event's tenant, when it has one.
const TenantHeader = wire.TenantHeader

// Publisher produces outbox events with a kgo.Client. Keep the client's
// idempotent writes (kgo's default): they keep the records of one partition
// in order across retries, which per-key order relies on.
type Publisher struct {
	client *kgo.Client
}

// NewPublisher returns a publisher producing with client, which it does not
// close.
func NewPublisher(client *kgo.Client) (*Publisher, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: kafkaoutbox: nil client", dedup.ErrConfig)
	}
	return &Publisher{client: client}, nil
}

// Publish produces events with one ProduceSync call and reports each
// record's result. Records the broker can never take (too large, an invalid
// or unknown topic, refused authorisation) are reported as permanent errors,
// which fail their rows at once; anything else is retried by the relay.
//
// A broker refuses a partition's whole record batch for one record in it
// (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE, INVALID_RECORD,
// CORRUPT_MESSAGE), and kgo fails the partition's later records with it.
// Publish produces the records so refused again, in two halves one after the
// other, each halved again while refused, so that only a record refused on
// its own fails (permanently, with its size in the reason) and the others
// are published in their key's order. Should a record produced again fail
// for a reason worth retrying, the later records of its key are left unsent
// (outbox.ErrNotAttempted). Setting kgo.ProducerBatchMaxBytesFn to the
// topics' max.message.bytes has kgo fail an oversized record alone before
// sending it, but kgo measures records before compression, so that also
// fails large records that would have fitted compressed.
//
// kgo does not give up on records it has sent (an idempotent producer cannot
// know whether the broker wrote them), so when ctx ends first Publish reports
// every event not yet acknowledged as such and returns, while kgo goes on
// with the records until they are resolved or the client is closed. The
// relay publishes the events again later, behind the first copies in their
// partitions, so order holds and the consumer drops the copies.
func (p *Publisher) Publish(ctx context.Context, events []outbox.Event) []error {
	errs := make([]error, len(events))
	all := make([]int, len(events))
	for i := range all {
		all[i] = i
	}
	p.produce(ctx, events, all, errs, map[string]bool{})
	return errs
}

// produce produces the events at idx (in publication order) in one
// ProduceSync and sets their errors, skipping those whose key is in held:
// the keys of events that failed and will be retried. The events refused
// with their record batch are produced again in halves, the first before
// the second.
func (p *Publisher) produce(ctx context.Context, events []outbox.Event, idx []int, errs []error, held map[string]bool) {
	recs := make([]*kgo.Record, 0, len(idx))
	index := make(map[*kgo.Record]int, len(idx))
	for _, i := range idx {
		if len(held) > 0 && held[heldKey(&events[i])] { // only after a refusal: no key built per event otherwise
			errs[i] = outbox.ErrNotAttempted
			continue
		}
		r := record(&events[i])
		recs = append(recs, r)
		index[r] = i
	}
	if len(recs) == 0 {
		return
	}
	notAcked := func() {
		err := fmt.Errorf("kafkaoutbox: not acknowledged: %w", context.Cause(ctx))
		for _, i := range index {
			errs[i] = err
		}
	}
	if ctx.Err() != nil {
		notAcked()
		return
	}
	done := make(chan kgo.ProduceResults, 1)
	go func() { done <- p.client.ProduceSync(ctx, recs...) }()
	var results kgo.ProduceResults
	select {
	case results = <-done:
	case <-ctx.Done():
		notAcked()
		return
	}
	var refused []int
	for _, res := range results {
		i := index[res.Record]
		switch {
		case res.Err == nil:
			errs[i] = nil
		case len(recs) > 1 && batchRefusal(res.Err):
			refused = append(refused, i)
		default:
			errs[i] = classify(res.Record, res.Err, len(recs) == 1)
			if k := heldKey(&events[i]); k != "" && !dedup.IsPermanent(errs[i]) {
				held[k] = true
			}
		}
	}
	if len(refused) > 0 {
		slices.Sort(refused)
		half := (len(refused) + 1) / 2
		p.produce(ctx, events, refused[:half], errs, held)
		p.produce(ctx, events, refused[half:], errs, held)
	}
}

// heldKey identifies the key of an event, or is "" for an event without
// one, which has no order to keep.
func heldKey(e *outbox.Event) string {
	if len(e.Key) == 0 {
		return ""
	}
	return e.Destination + "\x00" + string(e.Key)
}

func record(e *outbox.Event) *kgo.Record {
	r := &kgo.Record{Topic: e.Destination, Value: e.Payload}
	if len(e.Key) > 0 {
		r.Key = e.Key
	}
	r.Headers = make([]kgo.RecordHeader, 0, len(e.Headers)+2)
	for _, h := range e.Headers {
		if h.Key == wire.KafkaIDHeader || h.Key == TenantHeader {
			continue // the event's own ID and tenant win
		}
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
	}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: wire.KafkaIDHeader, Value: []byte(e.ID)})
	if e.Tenant != "" {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: TenantHeader, Value: []byte(e.Tenant)})
	}
	return r
}

// batchLevel are the errors with which a broker refuses a partition's whole
// record batch for what may be one record in it.
var batchLevel = []error{kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidRecord, kerr.CorruptMessage}

// permanent are the produce errors no retry fixes, once the record is
// refused on its own. kgo has already retried an unknown topic (see
// kgo.UnknownTopicRetries) before reporting it.
var permanent = append([]error{
	kerr.InvalidTopicException, kerr.UnknownTopicOrPartition, kerr.UnknownTopicID,
	kerr.TopicAuthorizationFailed,
}, batchLevel...)

func batchRefusal(err error) bool {
	return slices.ContainsFunc(batchLevel, func(e error) bool { return errors.Is(err, e) })
}

// classify wraps the error of record r, produced alone or not.
func classify(r *kgo.Record, err error, alone bool) error {
	if alone && batchRefusal(err) {
		err = fmt.Errorf("kafkaoutbox: produce to %q: record of %d bytes refused on its own: %w", r.Topic, size(r), err)
	} else {
		err = fmt.Errorf("kafkaoutbox: produce to %q: %w", r.Topic, err)
	}
	for _, p := range permanent {
		if errors.Is(err, p) {
			return dedup.Permanent(err)
		}
	}
	return err
}

// size is a record's key, value and headers in bytes.
func size(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}
