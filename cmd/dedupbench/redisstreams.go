package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/redisstreamdedup"
	"github.com/dedupkit/dedup/deduptype"
)

// streamGroup is the consumer group the Redis Streams rows read with.
const streamGroup = "dedupbench"

// runRedisStreams consumes a stream through redisstreamdedup.Consumer with
// its defaults (XREADGROUP batches of 50, one XACK per batch) over its
// default store, Redis itself (redisstore, on a client of its own).
func runRedisStreams(ctx context.Context, cfg config, m *meter) error {
	rdb, stream, drop, err := openRedisStream(ctx, cfg)
	if err != nil {
		return err
	}
	defer drop()
	store, closeStore, err := openRedisStore(ctx, cfg, m)
	if err != nil {
		return err
	}
	defer closeStore()
	msgs := redisstreamdedup.Messages()
	id := msgs.EventID
	msgs.EventID = func(msg *redisstreamdedup.Message) (string, error) {
		s, err := id(msg)
		if err == nil {
			m.entries.enter(s, now())
		}
		return s, err
	}
	w, err := dedup.Wrap(store, msgs, func(context.Context, *redisstreamdedup.Message) error { return nil },
		wrapperOpts("redisstreams", m)...)
	if err != nil {
		return err
	}
	c, err := redisstreamdedup.NewConsumer(rdb, stream, streamGroup, w, redisstreamdedup.WithBlock(200*time.Millisecond))
	if err != nil {
		return err
	}
	m.begin()
	m.started()
	return c.Run(ctx)
}

// runRedisStreamsNone reads the stream with XREADGROUP, 50 at a time, and
// acknowledges each read with one XACK, with no dedup: what Redis Streams
// and go-redis cost on their own.
func runRedisStreamsNone(ctx context.Context, cfg config, m *meter) error {
	rdb, stream, drop, err := openRedisStream(ctx, cfg)
	if err != nil {
		return err
	}
	defer drop()
	m.begin()
	m.started()
	for ctx.Err() == nil {
		res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: streamGroup, Consumer: "none",
			Streams: []string{stream, ">"}, Count: redisstreamdedup.DefaultBatchSize, Block: 200 * time.Millisecond}).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return ctxOr(ctx, err)
		}
		var ids []string
		for _, s := range res {
			for _, x := range s.Messages {
				ids = append(ids, x.ID)
			}
		}
		if err := rdb.XAck(ctx, stream, streamGroup, ids...).Err(); err != nil {
			return ctxOr(ctx, err)
		}
		m.settle(dedup.OutcomeProcessed, int64(len(ids)))
	}
	return nil
}

// openRedisStream returns a client of Redis and a new stream holding the row's
// events in eventOrder, with its group reading it from
// the start, and a function that deletes the stream and closes the client.
func openRedisStream(ctx context.Context, cfg config) (*redis.Client, string, func(), error) {
	rdb, err := newRedisClient(ctx, cfg)
	if err != nil {
		return nil, "", nil, err
	}
	stream := "dedupbench:stream:" + deduptype.NewOwnerToken()[:12]
	drop := func() {
		rdb.Del(context.Background(), stream)
		rdb.Close()
	}
	if err := rdb.XGroupCreateMkStream(ctx, stream, streamGroup, "0").Err(); err != nil {
		drop()
		return nil, "", nil, fmt.Errorf("create stream %s: %w", stream, err)
	}
	pipe := rdb.Pipeline()
	order := eventOrder(cfg.Records, cfg.Unique)
	for n, i := range order {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{
			redisstreamdedup.DefaultIDField, eventID(i), redisstreamdedup.DefaultPayloadField, eventBody(i),
		}})
		if pipe.Len() == 1000 || n == len(order)-1 {
			if _, err := pipe.Exec(ctx); err != nil {
				drop()
				return nil, "", nil, fmt.Errorf("add events: %w", err)
			}
		}
	}
	return rdb, stream, drop, nil
}
