package redisstreamoutbox_test

import (
	"context"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/redisstreamoutbox"
)

// A relay publishing the outbox's events to Redis Streams: each event to
// the stream its destination names, its ID in the "id" field, where a
// redisstreamdedup consumer reads it.
func ExampleNewPublisher() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	pub, err := redisstreamoutbox.NewPublisher(rdb)
	if err != nil {
		panic(err)
	}
	ob, err := outbox.New()
	if err != nil {
		panic(err)
	}
	pg, err := pgxpool.ParseConfig(os.Getenv("DEDUP_POSTGRES_DSN"))
	if err != nil {
		panic(err)
	}
	relay, err := outbox.NewRelay(ob, pg, pub)
	if err != nil {
		panic(err)
	}
	_ = relay.Run(ctx) // until ctx is done
}
