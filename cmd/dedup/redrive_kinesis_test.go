package main

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	ktypes "github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/lambdastreamdedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// A poison Kinesis record, dead-lettered by the Lambda handler to an SQS
// queue, is put back on its stream with its partition key once the handler
// is fixed: a dry run changes nothing; with -yes the letter leaves the
// queue, its record is reset, and the record put back is applied once (its
// event ID is in its data, WithIDField); a letter of another origin in the
// same queue is skipped and stays.
func TestRedriveKinesis(t *testing.T) {
	ctx := context.Background()
	streams := testenv.Kinesis(t)
	queues := testenv.SQS(t)
	stream, arn := testenv.KinesisStream(t, streams)
	dlq := testenv.SQSQueue(t, queues, nil)
	dsn, table, store, _ := postgresTable(t)
	sink, err := sqsdedup.NewSink(queues, dlq)
	require.NoError(t, err)
	scope := dedup.Scope("kinesis", "apply")

	effects := adaptertest.NewEffects()
	var broken atomic.Bool
	broken.Store(true)
	w, err := dedup.Wrap(store, lambdastreamdedup.KinesisMessages(lambdastreamdedup.WithIDField("id")),
		func(_ context.Context, r events.KinesisEventRecord) error {
			id := idField(r)
			effects.Call(id)
			if id == "k-1" && broken.Load() {
				return dedup.Permanent(errors.New("poison: a bug in the handler"))
			}
			effects.Apply(id)
			return nil
		}, dedup.WithScope(scope), dedup.WithSink(sink), dedup.WithLease(time.Minute), dedup.WithObserver(effects.Observe))
	require.NoError(t, err)
	handler := lambdastreamdedup.KinesisHandler(w)
	invoke := func(recs []events.KinesisEventRecord) {
		t.Helper()
		resp, err := handler(ctx, events.KinesisEvent{Records: recs})
		require.NoError(t, err)
		require.Empty(t, resp.BatchItemFailures, "every record settles (the poison one dead-lettered)")
	}

	for i, id := range []string{"k-0", "k-1", "k-2"} {
		_, err := streams.PutRecord(ctx, &kinesis.PutRecordInput{StreamName: aws.String(stream),
			PartitionKey: aws.String("customer-" + string(rune('a'+i))), Data: []byte(`{"id":"` + id + `"}`)})
		require.NoError(t, err)
	}
	first := readStream(t, streams, stream, arn, "")
	require.Len(t, first, 3)
	invoke(first)
	require.Equal(t, 0, effects.Count("k-1"))
	key := dedup.Key{Scope: scope, EventID: "k-1"}
	rec, err := store.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, dedup.StatusFailedFinal, rec.Status)
	// A letter from an SQS queue in the same dead-letter queue.
	require.NoError(t, sink.Send(ctx, dedup.DeadLetter{Payload: []byte("from a queue"), Reason: dedup.ReasonPermanent,
		Error: "bug", Attempts: 1, EventID: "q-1", Scope: scope, LastFailure: time.Now(),
		Origin: dedup.Origin{QueueURL: dlq + "-origin", MessageID: "m-q-1"}}))
	last := first[2].Kinesis.SequenceNumber

	redrive := func(extra ...string) string {
		t.Helper()
		code, out, errOut := cli(t, append([]string{"redrive", "kinesis",
			"-sqs", testenv.Env("DEDUP_SQS_ENDPOINT", "http://127.0.0.1:4566"), "-dlq-url", dlq,
			"-kinesis", testenv.Env("DEDUP_KINESIS_ENDPOINT", "http://127.0.0.1:4569"),
			"-postgres", dsn, "-table", table}, extra...)...)
		require.Equal(t, 0, code, errOut)
		return out
	}
	out := redrive()
	require.Contains(t, out, "would send "+key.String())
	require.Contains(t, out, "back to stream "+stream)
	require.Contains(t, out, "would send back 1, skipped 1")
	require.Contains(t, out, "not a Kinesis record's letter")
	require.ElementsMatch(t, []string{"k-1", "q-1"}, visible(t, queues, dlq), "a dry run deletes nothing")
	require.Empty(t, readStream(t, streams, stream, arn, last), "a dry run puts nothing")
	rec, err = store.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, dedup.StatusFailedFinal, rec.Status, "a dry run resets nothing")

	broken.Store(false) // the handler is fixed
	out = redrive("-yes")
	require.Contains(t, out, "sent back 1, skipped 1")
	_, err = store.Get(ctx, key)
	require.ErrorIs(t, err, dedup.ErrNotFound, "the record of k-1 was reset")
	require.Equal(t, []string{"q-1"}, visible(t, queues, dlq), "only the skipped letter stays")

	again := readStream(t, streams, stream, arn, last)
	require.Len(t, again, 1)
	require.Equal(t, `{"id":"k-1"}`, string(again[0].Kinesis.Data))
	require.Equal(t, first[1].Kinesis.PartitionKey, again[0].Kinesis.PartitionKey)
	invoke(again)
	invoke(readStream(t, streams, stream, arn, "")) // the whole stream again: duplicates
	effects.AssertOnce(t, []string{"k-0", "k-1", "k-2"})
	rec, err = store.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, dedup.StatusSucceeded, rec.Status)

	out = redrive("-yes")
	require.Contains(t, out, "sent back 0, skipped 1")
}

// idField returns the "id" field of a record's data.
func idField(r events.KinesisEventRecord) string {
	var d struct{ ID string }
	_ = json.Unmarshal(r.Kinesis.Data, &d)
	return d.ID
}

// readStream reads the records of the one-shard stream name after the
// sequence number after (from the start when empty), as Lambda delivers
// them to a handler.
func readStream(t *testing.T, client *kinesis.Client, name, arn, after string) []events.KinesisEventRecord {
	t.Helper()
	ctx := context.Background()
	shards, err := client.ListShards(ctx, &kinesis.ListShardsInput{StreamName: aws.String(name)})
	require.NoError(t, err)
	require.Len(t, shards.Shards, 1)
	shard := aws.ToString(shards.Shards[0].ShardId)
	in := &kinesis.GetShardIteratorInput{StreamName: aws.String(name), ShardId: aws.String(shard),
		ShardIteratorType: ktypes.ShardIteratorTypeTrimHorizon}
	if after != "" {
		in.ShardIteratorType, in.StartingSequenceNumber = ktypes.ShardIteratorTypeAfterSequenceNumber, aws.String(after)
	}
	it, err := client.GetShardIterator(ctx, in)
	require.NoError(t, err)
	var recs []events.KinesisEventRecord
	for iter := it.ShardIterator; iter != nil; {
		page, err := client.GetRecords(ctx, &kinesis.GetRecordsInput{ShardIterator: iter})
		require.NoError(t, err)
		for _, r := range page.Records {
			seq := aws.ToString(r.SequenceNumber)
			recs = append(recs, events.KinesisEventRecord{EventID: shard + ":" + seq, EventSourceArn: arn,
				EventName: "aws:kinesis:record", EventSource: "aws:kinesis",
				Kinesis: events.KinesisRecord{Data: r.Data, PartitionKey: aws.ToString(r.PartitionKey), SequenceNumber: seq,
					ApproximateArrivalTimestamp: events.SecondsEpochTime{Time: aws.ToTime(r.ApproximateArrivalTimestamp)}}})
		}
		if len(page.Records) == 0 && aws.ToInt64(page.MillisBehindLatest) == 0 {
			break
		}
		iter = page.NextShardIterator
	}
	return recs
}

// A letter whose stream does not exist stops the redrive with an error
// naming it and stays in the queue, visible at once for the next run.
func TestRedriveKinesisMissingStream(t *testing.T) {
	ctx := context.Background()
	testenv.Kinesis(t)
	queues := testenv.SQS(t)
	dlq := testenv.SQSQueue(t, queues, nil)
	dsn, table, _, _ := postgresTable(t)
	sink, err := sqsdedup.NewSink(queues, dlq)
	require.NoError(t, err)
	require.NoError(t, sink.Send(ctx, dedup.DeadLetter{Payload: []byte(`{"id":"k-9"}`), Reason: dedup.ReasonPermanent,
		Error: "bug", Attempts: 1, EventID: "k-9", Scope: "kinesis/apply", LastFailure: time.Now(),
		Headers: []dedup.Header{{Key: lambdastreamdedup.HeaderStreamARN, Value: []byte("arn:aws:kinesis:us-east-1:000000000000:stream/gone"), Type: "String"},
			{Key: lambdastreamdedup.HeaderPartitionKey, Value: []byte("customer-9"), Type: "String"}},
		Origin: dedup.Origin{Stream: "arn:aws:kinesis:us-east-1:000000000000:stream/gone", MessageID: "shardId-000000000000:1"}}))
	code, _, errOut := cli(t, "redrive", "kinesis", "-sqs", testenv.Env("DEDUP_SQS_ENDPOINT", "http://127.0.0.1:4566"),
		"-dlq-url", dlq, "-kinesis", testenv.Env("DEDUP_KINESIS_ENDPOINT", "http://127.0.0.1:4569"),
		"-stream", "dedup-test-missing-"+time.Now().Format("150405.000000"), "-postgres", dsn, "-table", table, "-yes")
	require.NotEqual(t, 0, code)
	require.Contains(t, errOut, "put \"kinesis/apply\"/k-9 back on stream dedup-test-missing-")
	require.Equal(t, []string{"k-9"}, visible(t, queues, dlq), "the letter stays, visible again")
}

func TestKinesisStreamName(t *testing.T) {
	for arn, want := range map[string]string{
		"arn:aws:kinesis:us-east-1:123456789012:stream/orders":                           "orders",
		"arn:aws-cn:kinesis:cn-north-1:123456789012:stream/a.b-c_d":                      "a.b-c_d",
		"arn:aws:dynamodb:us-east-1:123456789012:table/T/stream/2026-01-01T00:00:00.000": "",
		"arn:aws:kinesis:us-east-1:123456789012:stream/":                                 "",
		"orders": "",
		"":       "",
	} {
		got, ok := kinesisStreamName(arn)
		require.Equal(t, want, got, arn)
		require.Equal(t, want != "", ok, arn)
	}
}

func TestRedriveKinesisUsage(t *testing.T) {
	code, _, errOut := cli(t, "redrive", "kinesis", "-postgres", "postgres://x")
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, "-dlq-url is required")
}
