package lambdastreamdedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-lambda-go/events"

	"github.com/dedupkit/dedup"
)

// ErrNoEventID means a record carries no event ID where the handler looks
// for one; the record is dead-lettered with dedup.ReasonInvalidID.
var ErrNoEventID = errors.New("lambdastreamdedup: record carries no event ID")

// The headers a dead letter of a stream record carries beside dedup's
// metadata, naming where the record was in its stream.
const (
	// HeaderShard is the Kinesis shard ID (shardId-000000000000).
	HeaderShard = "stream-shard"
	// HeaderSequence is the record's sequence number in its shard.
	HeaderSequence = "stream-sequence-number"
	// HeaderStreamARN is the stream's ARN (the event source ARN).
	HeaderStreamARN = "stream-arn"
	// HeaderPartitionKey is a Kinesis record's partition key, which a
	// record put again to redrive its letter needs.
	HeaderPartitionKey = "stream-partition-key"
	// HeaderEventName is a DynamoDB Streams record's eventName (INSERT,
	// MODIFY, REMOVE).
	HeaderEventName = "stream-event-name"
)

// KinesisOpt chooses where [KinesisMessages] reads the event ID.
type KinesisOpt interface{ apply(*kinesisConfig) }

type kinesisOptFunc func(*kinesisConfig)

func (f kinesisOptFunc) apply(c *kinesisConfig) { f(c) }

type kinesisConfig struct{ field string }

// WithIDField reads the event ID from the named top-level string field of
// each record's data, a JSON object, instead of its partition key and
// sequence number: a producer that puts one event twice (a retried
// PutRecord gets a new sequence number) is caught only this way. A record
// whose data is no JSON object, or has no such non-empty string field, is
// dead-lettered with [ErrNoEventID].
func WithIDField(name string) KinesisOpt {
	return kinesisOptFunc(func(c *kinesisConfig) { c.field = name })
}

// KinesisMessages returns how a dedup.Wrapper reads the records of a Lambda
// Kinesis event: the event ID is the partition key and sequence number,
// "partitionKey:sequenceNumber" (see [WithIDField]), the payload the
// record's data, and a dead letter holds the data, the partition key as its
// message key, and the shard, sequence number, stream ARN and partition key
// as headers ([HeaderShard], [HeaderSequence], [HeaderStreamARN],
// [HeaderPartitionKey]); its origin names the
// stream (dedup-origin-stream) and the record's eventID
// (dedup-origin-message-id). To compute the event ID yourself, replace the
// EventID field of the result.
//
// An event ID is at most 255 bytes: a partition key longer than about 190
// bytes makes the default one too long, and the record is dead-lettered
// with dedup.ReasonInvalidID; use [WithIDField] for such keys. Records the
// Kinesis Producer Library aggregated arrive as one record: de-aggregate
// them before the wrapper if each is an event.
func KinesisMessages(opts ...KinesisOpt) dedup.Messages[events.KinesisEventRecord] {
	var cfg kinesisConfig
	for _, o := range opts {
		o.apply(&cfg)
	}
	return dedup.Messages[events.KinesisEventRecord]{
		EventID: func(r events.KinesisEventRecord) (string, error) {
			if cfg.field != "" {
				return jsonField(r.Kinesis.Data, cfg.field)
			}
			if r.Kinesis.PartitionKey == "" || r.Kinesis.SequenceNumber == "" {
				return "", fmt.Errorf("%w: no partition key or sequence number", ErrNoEventID)
			}
			return r.Kinesis.PartitionKey + ":" + r.Kinesis.SequenceNumber, nil
		},
		Payload: func(r events.KinesisEventRecord) []byte { return r.Kinesis.Data },
		DeadLetter: func(r events.KinesisEventRecord) dedup.DeadLetter {
			return dedup.DeadLetter{
				Payload:    r.Kinesis.Data,
				MessageKey: []byte(r.Kinesis.PartitionKey),
				Headers: headers(HeaderShard, kinesisShard(r), HeaderSequence, r.Kinesis.SequenceNumber,
					HeaderStreamARN, r.EventSourceArn, HeaderPartitionKey, r.Kinesis.PartitionKey),
				Origin: dedup.Origin{Stream: r.EventSourceArn, MessageID: r.EventID,
					Timestamp: r.Kinesis.ApproximateArrivalTimestamp.Time},
			}
		},
	}
}

// jsonField returns the named top-level string field of data, a JSON object.
func jsonField(data []byte, name string) (string, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return "", fmt.Errorf("%w: data is no JSON object: %v", ErrNoEventID, err)
	}
	var id string
	if raw, ok := fields[name]; !ok || json.Unmarshal(raw, &id) != nil || id == "" {
		return "", fmt.Errorf("%w: no %q string field in the data", ErrNoEventID, name)
	}
	return id, nil
}

// kinesisShard returns the shard of a record, which Lambda gives only as
// the prefix of its eventID ("shardId-000000000000:<sequence number>").
func kinesisShard(r events.KinesisEventRecord) string {
	shard, _, _ := strings.Cut(r.EventID, ":")
	return shard
}

// headers returns the non-empty values of name, value pairs as headers.
func headers(pairs ...string) []dedup.Header {
	h := make([]dedup.Header, 0, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] != "" {
			h = append(h, dedup.Header{Key: pairs[i], Value: []byte(pairs[i+1]), Type: "String"})
		}
	}
	return h
}

// KinesisHandler returns a Lambda handler for Kinesis events (pass it to
// lambda.Start) that runs each shard's records through w in order and
// reports, per shard, the sequence number of the first record that did not
// settle as the batch item failure, leaving the records after it unrun:
// Lambda retries from there, and the records already done answer as
// duplicates. The handler never returns an error: that would retry the
// whole batch. See the package documentation for the event source mapping
// this needs.
//
// The store lease defaults to the invocation's remaining time (its
// context's deadline) unless dedup.WithLease is set. A nil w makes every
// invocation fail with dedup.ErrConfig.
func KinesisHandler(w *dedup.Wrapper[events.KinesisEventRecord]) func(context.Context, events.KinesisEvent) (events.KinesisEventResponse, error) {
	p := newPolicy()
	return func(ctx context.Context, ev events.KinesisEvent) (events.KinesisEventResponse, error) {
		if w == nil {
			return events.KinesisEventResponse{}, nilWrapper("KinesisHandler")
		}
		var resp events.KinesisEventResponse
		for _, seq := range run(ctx, w, p, ev.Records, kinesisShard, func(r events.KinesisEventRecord) string { return r.Kinesis.SequenceNumber }) {
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.KinesisBatchItemFailure{ItemIdentifier: seq})
		}
		return resp, nil
	}
}
