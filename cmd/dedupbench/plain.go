package main

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
)

// consumePlain is a hand-written consumer, the shape of franz-go's
// goroutine-per-partition example: the poll loop hands each partition's
// records to that partition's worker (a channel of two batches, so memory is
// bounded), which runs process and marks them for commit. It is what the rows
// without the Kafka adapter use.
func consumePlain(ctx context.Context, cfg config, m *meter, group string, process func(ctx context.Context, recs []*kgo.Record)) error {
	cl, err := kgo.NewClient(append(kafkaOpts(cfg, m, group), kgo.AutoCommitMarks(), kgo.BlockRebalanceOnPoll())...)
	if err != nil {
		return err
	}
	defer cl.Close()
	workers := make(map[int32]chan []*kgo.Record)
	var wg sync.WaitGroup
	m.begin()
	for ctx.Err() == nil {
		fs := cl.PollRecords(ctx, kafkadedup.DefaultMaxPollRecords)
		if fs.IsClientClosed() || ctx.Err() != nil {
			break
		}
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			ch := workers[p.Partition]
			if ch == nil {
				ch = make(chan []*kgo.Record, 2)
				workers[p.Partition] = ch
				wg.Go(func() {
					for recs := range ch {
						process(ctx, recs)
						cl.MarkCommitRecords(recs[len(recs)-1])
					}
				})
			}
			select {
			case ch <- p.Records:
			case <-ctx.Done():
			}
		})
		cl.AllowRebalance()
	}
	for _, ch := range workers {
		close(ch)
	}
	wg.Wait()
	// Leaving the group in Close waits for a rebalance the poll loop holds.
	cl.AllowRebalance()
	return nil
}

// runNone consumes with a handler that does nothing: the ceiling.
func runNone(ctx context.Context, cfg config, m *meter) error {
	return consumePlain(ctx, cfg, m, "dedupbench-none", func(ctx context.Context, recs []*kgo.Record) {
		for _, r := range recs {
			t := now()
			_ = noop(ctx, r)
			m.lat.record(time.Duration(now() - t))
			m.settle(dedup.OutcomeProcessed, 1)
		}
	})
}

// runNaive runs each record through Wrapper.Handle: one claim, then one
// completion, per record, as most hand-written dedup does.
func runNaive(ctx context.Context, cfg config, m *meter) error {
	store, _, closeStore, err := openPostgresStore(ctx, cfg, m, "naive")
	if err != nil {
		return err
	}
	defer closeStore()
	return handleEach(ctx, cfg, m, store, "naive")
}

// runMemoryEach is the naive row over the memory store, to set beside the
// memory row's HandleBatch.
func runMemoryEach(ctx context.Context, cfg config, m *meter) error {
	return handleEach(ctx, cfg, m, dedup.NewMemoryStore(), "memory-each")
}

// handleEach consumes with the hand-written consumer, handling a
// partition's records one at a time with Handle, each tried again until it
// is settled. The wrapper's observer meters the results, as in the rows of
// the Kafka adapter.
func handleEach(ctx context.Context, cfg config, m *meter, store dedup.Store, name string) error {
	w, err := dedup.Wrap(store, messages(m), noop, wrapperOpts(name, m)...)
	if err != nil {
		return err
	}
	return consumePlain(ctx, cfg, m, "dedupbench-"+name, func(ctx context.Context, recs []*kgo.Record) {
		for _, r := range recs {
			for ctx.Err() == nil {
				res, err := w.Handle(ctx, r)
				if err == nil && res.Settled() {
					break
				}
				time.Sleep(max(res.RetryAfter, 10*time.Millisecond))
			}
		}
	})
}

// runFloor inserts each partition batch's event IDs with one multi-row
// INSERT ... ON CONFLICT DO NOTHING: what deduplicating the IDs costs
// PostgreSQL at the least, with no record state, lease or wrapper.
func runFloor(ctx context.Context, cfg config, m *meter) error {
	pool, table, closePool, err := openPostgres(ctx, cfg, m, "floor")
	if err != nil {
		return err
	}
	defer closePool()
	if _, err := pool.Exec(ctx, createFloor(table)); err != nil {
		return err
	}
	quiesce(ctx, cfg, pool)
	insert := `INSERT INTO ` + table + ` (scope, event_id) SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING`
	id := kafkadedup.Messages().EventID
	var failed error
	var once sync.Once
	err = consumePlain(ctx, cfg, m, "dedupbench-floor", func(ctx context.Context, recs []*kgo.Record) {
		ids := make([]string, len(recs))
		for i, r := range recs {
			ids[i], _ = id(r)
		}
		for ctx.Err() == nil {
			t := now()
			tag, err := pool.Exec(ctx, insert, scopeOf("floor"), ids)
			if err != nil {
				once.Do(func() { failed = err })
				time.Sleep(10 * time.Millisecond)
				continue
			}
			d := time.Duration(now() - t)
			for range recs {
				m.lat.record(d)
			}
			inserted := tag.RowsAffected()
			m.settle(dedup.OutcomeProcessed, inserted)
			m.settle(dedup.OutcomeDuplicate, int64(len(recs))-inserted)
			return
		}
	})
	if err == nil {
		err = failed
	}
	return err
}

// runDynamoDBFloor is the least DynamoDB can do with the same event IDs
// through the same client: one conditional PutItem per record, which fails
// when the ID is there, 16 at once per partition batch as the store's
// ClaimBatch sends them; nothing else.
func runDynamoDBFloor(ctx context.Context, cfg config, m *meter) error {
	client, table, drop, err := openDynamoDB(ctx, cfg, m)
	if err != nil {
		return err
	}
	defer drop()
	id := kafkadedup.Messages().EventID
	var failed error
	var once sync.Once
	err = consumePlain(ctx, cfg, m, "dedupbench-dynamodb-floor", func(ctx context.Context, recs []*kgo.Record) {
		var wg sync.WaitGroup
		slots := make(chan struct{}, dynamoDBConcurrency)
		for _, r := range recs {
			eventID, _ := id(r)
			slots <- struct{}{}
			wg.Go(func() {
				defer func() { <-slots }()
				for ctx.Err() == nil {
					t := now()
					_, err := client.PutItem(ctx, &dynamodb.PutItemInput{
						TableName:                aws.String(table),
						Item:                     map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "dedupbench/dynamodb-floor\x00" + eventID}},
						ConditionExpression:      aws.String("attribute_not_exists(#pk)"),
						ExpressionAttributeNames: map[string]string{"#pk": "pk"},
					})
					var exists *types.ConditionalCheckFailedException
					switch {
					case err == nil:
						m.settle(dedup.OutcomeProcessed, 1)
					case errors.As(err, &exists):
						m.settle(dedup.OutcomeDuplicate, 1)
					default:
						once.Do(func() { failed = err })
						time.Sleep(10 * time.Millisecond)
						continue
					}
					m.lat.record(time.Duration(now() - t))
					return
				}
			})
		}
		wg.Wait()
	})
	if err == nil {
		err = failed
	}
	return err
}

// dynamoDBConcurrency is how many requests the DynamoDB store sends at once
// for one batch.
const dynamoDBConcurrency = 16
