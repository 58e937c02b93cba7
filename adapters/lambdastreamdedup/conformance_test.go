package lambdastreamdedup_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/lambdastreamdedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// features: a stream played in process has no connection to break; the
// shards are shared by several consumers, one invocation per shard at a
// time.
var features = adaptertest.Features{NoConnectionLoss: true}

// KinesisHandler passes the adapter conformance suite over shards played in
// process as a Kinesis event source mapping with ReportBatchItemFailures
// plays them. The suite's event ID is the record's partition key (the
// handler's Messages read it there, as a producer keying its records by
// event would): Kinesis's default ID, partition key and sequence number,
// is new for each record put, so no copy the suite publishes would be one.
func TestConformanceKinesis(t *testing.T) {
	adaptertest.Run(t, features, func(t *testing.T) adaptertest.Harness {
		arn := "arn:aws:kinesis:us-east-1:123456789012:stream/adaptertest-" + strings.ToLower(rand.Text()[:10])
		msgs := lambdastreamdedup.KinesisMessages()
		msgs.EventID = func(r events.KinesisEventRecord) (string, error) {
			if r.Kinesis.PartitionKey == "" {
				return "", lambdastreamdedup.ErrNoEventID
			}
			return r.Kinesis.PartitionKey, nil
		}
		return newStreamHarness(streamKind[events.KinesisEventRecord]{
			messages: msgs,
			record: func(shard int, seq string, m adaptertest.Message) events.KinesisEventRecord {
				var r events.KinesisEventRecord
				r.EventSource, r.EventSourceArn, r.EventName = "aws:kinesis", arn, "aws:kinesis:record"
				r.EventID = fmt.Sprintf("shardId-%012d:%s", shard, seq)
				r.Kinesis.PartitionKey, r.Kinesis.SequenceNumber, r.Kinesis.Data = m.ID, seq, m.Payload
				return r
			},
			sequence: func(r events.KinesisEventRecord) string { return r.Kinesis.SequenceNumber },
			read: func(r events.KinesisEventRecord) adaptertest.Message {
				return adaptertest.Message{ID: r.Kinesis.PartitionKey, Payload: r.Kinesis.Data}
			},
			invoke: func(ctx context.Context, w *dedup.Wrapper[events.KinesisEventRecord], batch []events.KinesisEventRecord) ([]string, error) {
				resp, err := lambdastreamdedup.KinesisHandler(w)(ctx, events.KinesisEvent{Records: batch})
				var failed []string
				for _, f := range resp.BatchItemFailures {
					failed = append(failed, f.ItemIdentifier)
				}
				return failed, err
			},
			letterPayload: func(dl dedup.DeadLetter) ([]byte, error) { return dl.Payload, nil },
		})
	})
}

// DynamoDBHandler passes the suite over one stream shard played in process
// (a DynamoDB Streams batch comes from one shard). The event ID is the
// record's eventID, the payload a string attribute of its new image. A
// DynamoDB stream never holds one eventID twice: a copy the suite publishes
// is the same record again, sequence number and all, as Lambda retrying it
// delivers it, and so has the same change and fingerprint.
func TestConformanceDynamoDB(t *testing.T) {
	adaptertest.Run(t, features, func(t *testing.T) adaptertest.Harness {
		arn := "arn:aws:dynamodb:us-east-1:123456789012:table/adaptertest/stream/" + strings.ToLower(rand.Text()[:10])
		return newStreamHarness(streamKind[events.DynamoDBEventRecord]{
			shards:   1,
			messages: lambdastreamdedup.DynamoDBMessages(),
			record: func(_ int, seq string, m adaptertest.Message) events.DynamoDBEventRecord {
				id := events.NewStringAttribute(m.ID)
				return events.DynamoDBEventRecord{
					EventID: m.ID, EventName: "INSERT", EventSource: "aws:dynamodb", EventSourceArn: arn,
					Change: events.DynamoDBStreamRecord{
						Keys:           map[string]events.DynamoDBAttributeValue{"id": id},
						NewImage:       map[string]events.DynamoDBAttributeValue{"id": id, "payload": events.NewStringAttribute(string(m.Payload))},
						SequenceNumber: seq, StreamViewType: "NEW_IMAGE",
					},
				}
			},
			sequence: func(r events.DynamoDBEventRecord) string { return r.Change.SequenceNumber },
			read: func(r events.DynamoDBEventRecord) adaptertest.Message {
				return adaptertest.Message{ID: r.EventID, Payload: []byte(r.Change.NewImage["payload"].String())}
			},
			invoke: func(ctx context.Context, w *dedup.Wrapper[events.DynamoDBEventRecord], batch []events.DynamoDBEventRecord) ([]string, error) {
				resp, err := lambdastreamdedup.DynamoDBHandler(w)(ctx, events.DynamoDBEvent{Records: batch})
				var failed []string
				for _, f := range resp.BatchItemFailures {
					failed = append(failed, f.ItemIdentifier)
				}
				return failed, err
			},
			// The letter holds the whole record as JSON.
			letterPayload: func(dl dedup.DeadLetter) ([]byte, error) {
				var r events.DynamoDBEventRecord
				if err := json.Unmarshal(dl.Payload, &r); err != nil {
					return nil, err
				}
				return []byte(r.Change.NewImage["payload"].String()), nil
			},
			sameRecord: true,
		})
	})
}

// shardOf returns the shard of n a partition key hashes to.
func shardOf(key string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(n))
}

// sequenceNumber returns the n-th sequence number of a stream, in order as
// strings and as numbers.
func sequenceNumber(n int) string { return fmt.Sprintf("%021d", n) }
