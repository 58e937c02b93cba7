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

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/dedupkit/dedup/outbox"
)

// TenantHeader is the header carrying an event's tenant, when it has one.
const TenantHeader = "tenant"

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
// kgo does not give up on records it has sent (an idempotent producer cannot
// know whether the broker wrote them), so when ctx ends first Publish reports
// every event as not acknowledged and returns, while kgo goes on with the
// records until they are resolved or the client is closed. The relay
// publishes the events again later, behind the first copies in their
// partitions, so order holds and the consumer drops the copies.
func (p *Publisher) Publish(ctx context.Context, events []outbox.Event) []error {
	recs := make([]*kgo.Record, len(events))
	for i := range events {
		recs[i] = record(&events[i])
	}
	done := make(chan kgo.ProduceResults, 1)
	go func() { done <- p.client.ProduceSync(ctx, recs...) }()
	errs := make([]error, len(events))
	select {
	case results := <-done:
		index := make(map[*kgo.Record]int, len(recs))
		for i, r := range recs {
			index[r] = i
		}
		for _, res := range results {
			if res.Err != nil {
				errs[index[res.Record]] = classify(res.Record.Topic, res.Err)
			}
		}
	case <-ctx.Done():
		err := fmt.Errorf("kafkaoutbox: not acknowledged: %w", context.Cause(ctx))
		for i := range errs {
			errs[i] = err
		}
	}
	return errs
}

func record(e *outbox.Event) *kgo.Record {
	r := &kgo.Record{Topic: e.Destination, Value: e.Payload}
	if len(e.Key) > 0 {
		r.Key = e.Key
	}
	r.Headers = make([]kgo.RecordHeader, 0, len(e.Headers)+2)
	for _, h := range e.Headers {
		if h.Key == kafkadedup.DefaultIDHeader || h.Key == TenantHeader {
			continue // the event's own ID and tenant win
		}
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
	}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: kafkadedup.DefaultIDHeader, Value: []byte(e.ID)})
	if e.Tenant != "" {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: TenantHeader, Value: []byte(e.Tenant)})
	}
	return r
}

// permanent are the produce errors no retry fixes. kgo has already retried
// an unknown topic (see kgo.UnknownTopicRetries) before reporting it.
var permanent = []error{
	kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidRecord, kerr.CorruptMessage,
	kerr.InvalidTopicException, kerr.UnknownTopicOrPartition, kerr.UnknownTopicID,
	kerr.TopicAuthorizationFailed,
}

func classify(topic string, err error) error {
	err = fmt.Errorf("kafkaoutbox: produce to %q: %w", topic, err)
	for _, p := range permanent {
		if errors.Is(err, p) {
			return dedup.Permanent(err)
		}
	}
	return err
}
