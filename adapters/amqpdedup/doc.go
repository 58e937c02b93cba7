// Package amqpdedup runs RabbitMQ deliveries (AMQP 0-9-1, amqp091-go)
// through a dedup.Wrapper, so that each event has one effect however often
// RabbitMQ delivers it, and parks poison messages in a dead-letter queue.
//
// It has three parts:
//
//   - [Messages] tells a dedup.Wrapper how to read an amqp091.Delivery: the
//     event ID from the message_id property (or a header, or a function),
//     the body as the payload, and a quorum queue's x-delivery-count, on a
//     redelivery only (a publisher can write that header too), as the
//     transport's attempt count; the deliveries a Consumer hands over carry
//     its queue, the origin of their letters.
//   - [Consumer] consumes a queue with manual acknowledgements and a bounded
//     prefetch, acknowledges a delivery only once its outcome is settled,
//     returns the others to the queue after their backoff, connects again
//     within about a second of the broker's return when the connection or
//     the channel is lost, and reports in [Consumer.Health] a queue it
//     cannot consume and a missing dead-letter queue ([WithDeadLetterQueue]).
//   - [Sink] is a dedup.Sink that publishes dead letters with publisher
//     confirms and as mandatory, so that a letter is acknowledged by the
//     broker, or an error, before the original is.
//
// A worker:
//
//	const queue = "orders"
//	quorum := amqp.Table{"x-queue-type": "quorum"}
//	_, err := ch.QueueDeclare(queue, true, false, false, false, quorum)
//	...
//	_, err = ch.QueueDeclare(queue+".dlq", true, false, false, false, quorum)
//	...
//	sink, err := amqpdedup.NewSink(url) // letters to "orders.dlq"
//	...
//	w, err := dedup.Wrap(store, amqpdedup.Messages(queue), handle,
//		dedup.WithScope(dedup.Scope("orders", "charge")), dedup.WithSink(sink))
//	...
//	consumer, err := amqpdedup.NewConsumer(url, queue, w)
//	...
//	err = consumer.Run(ctx) // until ctx is cancelled
package amqpdedup
