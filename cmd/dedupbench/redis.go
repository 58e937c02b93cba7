package main

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/redisstore"
)

// runRedis runs the Kafka adapter (kafkadedup.Consumer, HandleBatch per
// fetched partition batch) over Redis, with the defaults or with
// -batch-wait: the PostgreSQL rows batch-claim and batched, on the other store.
func runRedis(batchCompletion bool) rowRun {
	return func(ctx context.Context, cfg config, m *meter) error {
		name := "redis-batch-claim"
		var extra []dedup.Opt
		if batchCompletion {
			name = "redis-batched"
			extra = append(extra, dedup.WithBatchCompletion(cfg.BatchWait))
		}
		store, closeStore, err := openRedisStore(ctx, cfg, m)
		if err != nil {
			return err
		}
		defer closeStore()
		return consumeStore(ctx, cfg, m, store, name, extra...)
	}
}

// openRedisStore returns a store under a key prefix of its own, whose round
// trips m counts as store calls (a pipeline is one), and a function that
// deletes the row's keys and closes the client.
func openRedisStore(ctx context.Context, cfg config, m *meter) (*redisstore.Store, func(), error) {
	client, err := newRedisClient(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	client.AddHook(roundTrips{&m.store.n})
	prefix := "dedupbench:" + deduptype.NewOwnerToken()[:12] + ":"
	store, err := redisstore.New(client, redisstore.WithKeyPrefix(prefix))
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	cleanup := func() {
		ctx := context.Background()
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			if keys = append(keys, iter.Val()); len(keys) == 1000 {
				client.Unlink(ctx, keys...)
				keys = keys[:0]
			}
		}
		if len(keys) > 0 {
			client.Unlink(ctx, keys...)
		}
		client.Close()
	}
	return store, cleanup, nil
}

// newRedisClient returns a client of -redis, which answered a PING.
func newRedisClient(ctx context.Context, cfg config) (*redis.Client, error) {
	opts := &redis.Options{Addr: cfg.Redis}
	if strings.Contains(cfg.Redis, "://") {
		var err error
		if opts, err = redis.ParseURL(cfg.Redis); err != nil {
			return nil, fmt.Errorf("-redis: %w", err)
		}
	}
	client := redis.NewClient(opts)
	if err := client.Ping(ctx).Err(); err != nil {
		client.Close()
		return nil, fmt.Errorf("redis at %s: %w (run `make services`)", opts.Addr, err)
	}
	return client, nil
}

// roundTrips is a go-redis hook counting round trips: one per command, one
// per pipeline.
type roundTrips struct{ n *atomic.Int64 }

func (h roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}
