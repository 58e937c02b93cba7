// Package pubsubdedup runs Google Cloud Pub/Sub messages
// (cloud.google.com/go/pubsub/v2) through a dedup.Wrapper, so that each
// event has one effect however often Pub/Sub delivers it, and parks poison
// messages in a dead-letter topic.
//
// It has three parts:
//
//   - [Messages] tells a dedup.Wrapper how to read a *pubsub.Message: the
//     event ID from the message ID, or from an attribute the producer sets
//     ([WithIDAttribute]; a retried publish makes a new message ID), the
//     data as the payload, and the delivery attempt, which Pub/Sub sets when
//     the subscription has a dead-letter policy, as the transport's attempt
//     count.
//   - [Consumer] receives with the client's Subscriber.Receive, whose lease
//     management extends the ack deadline of held messages (configured from
//     the subscription's ack deadline, not copied), acknowledges settled
//     messages, nacks the others after the wrapper's delay (or at once when
//     the subscription's retry policy backs off), keeps ordering keys in
//     order, shuts down gracefully, and reports an outage of the store or
//     the sink ([Consumer.Health], [WithMaxOutage]).
//   - [Sink] is a dedup.Sink that publishes dead letters to a topic, with
//     dedup's metadata as attributes and the original's ordering key.
//
// A worker:
//
//	client, _ := pubsub.NewClient(ctx, "my-project")
//	sink, _ := pubsubdedup.NewSink(client, "orders-dlq")
//	defer sink.Stop()
//	w, _ := dedup.Wrap(store, pubsubdedup.Messages(pubsubdedup.WithIDAttribute("event-id")), charge,
//		dedup.WithScope(dedup.Scope("billing", "charge")), dedup.WithSink(sink))
//	c, _ := pubsubdedup.NewConsumer(client, "billing", w)
//	err := c.Run(ctx) // until ctx is cancelled
//
// The client honours PUBSUB_EMULATOR_HOST, so the same code runs against
// the Pub/Sub emulator; the tests run against pstest, the client library's
// in-process server.
package pubsubdedup
