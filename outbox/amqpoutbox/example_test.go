package amqpoutbox_test

import (
	"context"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/amqpoutbox"
)

// A relay publishing the outbox's events to RabbitMQ: each event to the
// queue its destination names (through the default exchange), its ID as
// message_id, where an amqpdedup consumer reads it.
func ExampleNewPublisher() {
	ctx := context.Background()
	pub, err := amqpoutbox.NewPublisher("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		panic(err)
	}
	defer pub.Close()
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
