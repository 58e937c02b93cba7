package kafkaoutbox_test

import (
	"context"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/kafkaoutbox"
)

// A relay publishing the outbox's events to Kafka: each event to the topic
// its destination names, its key as the record key, its ID in the
// "event-id" header, where a kafkadedup consumer reads it.
func ExampleNewPublisher() {
	ctx := context.Background()
	client, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:9092"))
	if err != nil {
		panic(err)
	}
	defer client.Close()
	pub, err := kafkaoutbox.NewPublisher(client)
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
