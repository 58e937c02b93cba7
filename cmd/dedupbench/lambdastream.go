package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/lambdastreamdedup"
)

// lambdaBatch is how many records an invocation gets: the default batch
// size of a Kinesis event source mapping.
const lambdaBatch = 100

// streamHandler is what a Lambda function for Kinesis runs per invocation.
type streamHandler func(context.Context, events.KinesisEvent) (events.KinesisEventResponse, error)

// runLambdaStream invokes lambdastreamdedup.KinesisHandler over PostgreSQL
// with the row's events as Lambda does for a Kinesis stream of -partitions
// shards: one invocation per shard at a time, batches of 100 records, the
// next batch from the reported sequence number.
func runLambdaStream(ctx context.Context, cfg config, m *meter) error {
	store, _, closeStore, err := openPostgresStore(ctx, cfg, m, "lambdastream")
	if err != nil {
		return err
	}
	defer closeStore()
	msgs := metered(m, lambdastreamdedup.KinesisMessages(lambdastreamdedup.WithIDField("event")))
	w, err := dedup.Wrap(store, msgs, func(context.Context, events.KinesisEventRecord) error { return nil },
		wrapperOpts("lambdastream", m)...)
	if err != nil {
		return err
	}
	return invokeShards(ctx, cfg, m, lambdastreamdedup.KinesisHandler(w))
}

// runLambdaStreamNone makes the same invocations of a handler that runs
// each record with no dedup: the floor of the row above.
func runLambdaStreamNone(ctx context.Context, cfg config, m *meter) error {
	return invokeShards(ctx, cfg, m, func(ctx context.Context, ev events.KinesisEvent) (events.KinesisEventResponse, error) {
		for _, r := range ev.Records {
			t := now()
			_ = func(context.Context, events.KinesisEventRecord) error { return nil }(ctx, r)
			m.lat.record(time.Duration(now() - t))
			m.settle(dedup.OutcomeProcessed, 1)
		}
		return events.KinesisEventResponse{}, nil
	})
}

// invokeShards plays the Lambda service: a goroutine per shard invokes h
// with the shard's next batch until the shard is read, then waits for ctx.
func invokeShards(ctx context.Context, cfg config, m *meter, h streamHandler) error {
	shards := streamShards(cfg)
	errs := make(chan error, len(shards))
	var wg sync.WaitGroup
	m.begin()
	m.started()
	for _, recs := range shards {
		wg.Go(func() {
			for pos := 0; pos < len(recs) && ctx.Err() == nil; {
				batch := recs[pos:min(pos+lambdaBatch, len(recs))]
				resp, err := h(ctx, events.KinesisEvent{Records: batch})
				if err != nil {
					errs <- err
					return
				}
				pos += settledPrefix(batch, resp)
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		return ctxOr(ctx, err)
	default:
	}
	<-ctx.Done()
	return nil
}

// settledPrefix returns how many records of batch Lambda moves past for
// resp: all, or those before the first reported sequence number.
func settledPrefix(batch []events.KinesisEventRecord, resp events.KinesisEventResponse) int {
	for i, r := range batch {
		for _, f := range resp.BatchItemFailures {
			if f.ItemIdentifier == r.Kinesis.SequenceNumber {
				return i
			}
		}
	}
	return len(batch)
}

// streamShards puts the row's events (eventOrder) in records of the shard
// their partition key (the event ID) hashes to, with increasing sequence
// numbers, as Kinesis does.
func streamShards(cfg config) [][]events.KinesisEventRecord {
	shards := make([][]events.KinesisEventRecord, max(1, cfg.Partitions))
	for k, i := range eventOrder(cfg.Records, cfg.Unique) {
		id := eventID(i)
		h := fnv.New32a()
		_, _ = h.Write([]byte(id))
		s := int(h.Sum32() % uint32(len(shards)))
		seq := fmt.Sprintf("4959033827149025660855969253836157109592157598%010d", k)
		shards[s] = append(shards[s], events.KinesisEventRecord{
			EventID: fmt.Sprintf("shardId-%012d:%s", s, seq), EventSourceArn: "arn:aws:kinesis:us-east-1:123456789012:stream/dedupbench",
			Kinesis: events.KinesisRecord{PartitionKey: id, SequenceNumber: seq,
				Data: fmt.Appendf(nil, `{"event":%q,"customer":%d,"cents":%d}`, id, i%997, 100+i%9973)},
		})
	}
	return shards
}
