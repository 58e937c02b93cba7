package natsdedup_test

import (
	"context"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/natsdedup"
)

// A consumer of a JetStream stream whose handler runs once per event, with
// the records in PostgreSQL: settled messages are acknowledged, a poison one
// is parked in the "dlq.>" stream after five attempts and terminated.
func ExampleNewConsumer() {
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
	// The dead letters' stream, and the durable consumer of the orders.
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "ORDERS_DLQ", Subjects: []string{"dlq.orders.>"}}); err != nil {
		panic(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1,
	})
	if err != nil {
		panic(err)
	}

	pool, err := pgxpool.New(ctx, os.Getenv("DEDUP_POSTGRES_DSN"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	store, err := dedup.NewPostgresStore(pool)
	if err != nil {
		panic(err)
	}
	sink, err := natsdedup.NewSink(js)
	if err != nil {
		panic(err)
	}
	charge := func(ctx context.Context, m jetstream.Msg) error { return nil } // the business effect
	w, err := dedup.Wrap(store, natsdedup.Messages(), charge,
		dedup.WithScope(dedup.Scope("billing", "charge")), dedup.WithSink(sink), dedup.WithMaxAttempts(5))
	if err != nil {
		panic(err)
	}
	consumer, err := natsdedup.NewConsumer(cons, w)
	if err != nil {
		panic(err)
	}
	_ = consumer.Run(ctx) // until ctx is done: drains, acks what settled, naks the rest
}
