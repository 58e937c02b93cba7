package amqpdedup_test

import (
	"context"
	"log"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/amqpdedup"
)

// A worker charging each order once, however often RabbitMQ delivers it,
// with letters going to the "orders.dlq" queue.
func ExampleNewConsumer() {
	url := "amqp://guest:guest@127.0.0.1:5672/"
	sink, err := amqpdedup.NewSink(url)
	if err != nil {
		log.Fatal(err)
	}
	defer sink.Close()
	charge := func(ctx context.Context, d amqp.Delivery) error {
		// Charge the order in d.Body.
		return nil
	}
	const queue = "orders" // named once, for both
	w, err := dedup.Wrap(dedup.NewMemoryStore(), amqpdedup.Messages(queue), charge,
		dedup.WithScope(dedup.Scope("orders", "charge")), dedup.WithSink(sink))
	if err != nil {
		log.Fatal(err)
	}
	consumer, err := amqpdedup.NewConsumer(url, queue, w)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a real worker runs until it is told to stop
	if err := consumer.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
