package sqsdedup_test

import (
	"context"
	"os"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
)

// A consumer of an SQS queue whose handler runs once per event, with the
// records in PostgreSQL: messages are deleted once settled, a poison one is
// parked in the dead-letter queue after five attempts.
func ExampleNewConsumer() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		panic(err)
	}
	client := sqs.NewFromConfig(cfg)
	queueURL, dlqURL := os.Getenv("ORDERS_QUEUE_URL"), os.Getenv("ORDERS_DLQ_URL")

	pool, err := pgxpool.New(ctx, os.Getenv("DEDUP_POSTGRES_DSN"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	store, err := dedup.NewPostgresStore(pool)
	if err != nil {
		panic(err)
	}
	dlq, err := sqsdedup.NewSink(client, dlqURL)
	if err != nil {
		panic(err)
	}
	charge := func(ctx context.Context, m types.Message) error { return nil } // the business effect
	w, err := dedup.Wrap(store, sqsdedup.Messages(queueURL), charge,
		dedup.WithScope(dedup.Scope("billing", "charge")), dedup.WithSink(dlq), dedup.WithMaxAttempts(5))
	if err != nil {
		panic(err)
	}
	consumer, err := sqsdedup.NewConsumer(client, queueURL, w)
	if err != nil {
		panic(err)
	}
	_ = consumer.Run(ctx) // until ctx is done: drains, deletes what settled, gives back the rest
}
