package redisstreamdedup_test

import (
	"context"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/redisstreamdedup"
)

// A consumer of a Redis stream whose handler runs once per event, with the
// records in PostgreSQL: settled entries are acknowledged, a poison one is
// parked in the "orders:dlq" stream after five deliveries and
// acknowledged.
func ExampleNewConsumer() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	// The group, once; "BUSYGROUP" when it exists already.
	_ = rdb.XGroupCreateMkStream(ctx, "orders", "billing", "$").Err()

	pool, err := pgxpool.New(ctx, os.Getenv("DEDUP_POSTGRES_DSN"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	store, err := dedup.NewPostgresStore(pool)
	if err != nil {
		panic(err)
	}
	sink, err := redisstreamdedup.NewSink(rdb)
	if err != nil {
		panic(err)
	}
	charge := func(ctx context.Context, m *redisstreamdedup.Message) error { return nil } // the business effect
	w, err := dedup.Wrap(store, redisstreamdedup.Messages(), charge,
		dedup.WithScope(dedup.Scope("billing", "charge")), dedup.WithSink(sink), dedup.WithMaxAttempts(5))
	if err != nil {
		panic(err)
	}
	consumer, err := redisstreamdedup.NewConsumer(rdb, "orders", "billing", w)
	if err != nil {
		panic(err)
	}
	_ = consumer.Run(ctx) // until ctx is done: drains, acks what settled, gives back the rest
}
