package sqsoutbox_test

import (
	"context"
	"os"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/sqsoutbox"
)

// A relay publishing the outbox's events to SQS: each event to the queue
// its destination names (a URL or a name), its ID in the "event-id"
// message attribute, where an sqsdedup consumer reads it.
func ExampleNewPublisher() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		panic(err)
	}
	pub, err := sqsoutbox.NewPublisher(sqs.NewFromConfig(cfg))
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
