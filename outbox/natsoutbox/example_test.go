package natsoutbox_test

import (
	"context"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/natsoutbox"
)

// A relay publishing the outbox's events to JetStream: each event to the
// subject its destination names, its ID as Nats-Msg-Id, where a natsdedup
// consumer reads it and where the stream drops a republish within its
// duplicate window.
func ExampleNewPublisher() {
	ctx := context.Background()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		panic(err)
	}
	pub, err := natsoutbox.NewPublisher(js)
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
