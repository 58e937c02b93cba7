// Package sqsdedup runs Amazon SQS messages through a dedup.Wrapper, so that
// each event has one effect however often SQS delivers it, and parks poison
// messages in a dead-letter queue.
//
// It has these parts:
//
//   - [Messages] tells a dedup.Wrapper how to read a types.Message: the
//     event ID from the "event-id" message attribute (or, on a FIFO queue,
//     the MessageDeduplicationId), the body as the payload, and
//     ApproximateReceiveCount as the transport's attempt count.
//   - [Consumer] long-polls a queue with a bounded number of workers, keeps
//     held messages invisible with a heartbeat, deletes settled messages in
//     batches, backs failed ones off through their visibility timeout, keeps
//     FIFO groups in order, shuts down gracefully, and reports an outage of
//     the store or the sink (an ERROR log, [Consumer.Health],
//     [WithMaxOutage]).
//   - [Sink] is a dedup.Sink that sends dead letters to an SQS queue.
//   - [LambdaHandler] does the same for a Lambda function subscribed to a
//     queue, reporting partial batch failures; [LambdaMessages] reads its
//     events.SQSMessage records.
//   - [WithSNSEnvelope], [WithSNSIDAttribute] and [WithEventBridgeEnvelope]
//     read the event ID and payload inside an SNS notification or an
//     EventBridge event delivered to the queue; [UnwrapSNS] and
//     [UnwrapEventBridge] give a handler what is inside.
//
// A worker:
//
//	client := sqs.NewFromConfig(cfg)
//	sink, err := sqsdedup.NewSink(client, dlqURL)
//	...
//	w, err := dedup.Wrap(store, sqsdedup.Messages(queueURL), handle,
//		dedup.WithScope(dedup.Scope("orders", "charge")),
//		dedup.WithSink(sink)) // the lease follows the queue's visibility timeout
//	...
//	consumer, err := sqsdedup.NewConsumer(client, queueURL, w)
//	...
//	err = consumer.Run(ctx) // until ctx is cancelled
package sqsdedup
