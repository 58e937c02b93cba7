// Package natsdedup runs NATS JetStream messages through a dedup.Wrapper, so
// that each event has one effect however often JetStream delivers it, and
// parks poison messages in a dead-letter stream.
//
// It has three parts:
//
//   - [Messages] tells a dedup.Wrapper how to read a jetstream.Msg: the
//     event ID from the "Nats-Msg-Id" header (JetStream itself drops a
//     republish within the stream's duplicate window; the wrapper catches
//     every copy after it and every redelivery), the data as the payload,
//     and NumDelivered as the transport's attempt count.
//   - [Consumer] pulls from a pull consumer with explicit acks, in bounded
//     batches, keeps held messages from redelivery with InProgress, acks
//     settled messages (DoubleAck), terminates parked ones, naks the others
//     with a delay, shuts down gracefully, and reports an outage of the store
//     or the sink ([Consumer.Health], [WithMaxOutage]), a lost connection
//     and a missing dead-letter stream ([WithJetStream]).
//   - [Sink] is a dedup.Sink that publishes dead letters to a JetStream
//     stream, "dlq." + the origin subject by default.
//
// A worker:
//
//	nc, _ := nats.Connect(nats.DefaultURL)
//	js, _ := jetstream.New(nc)
//	js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
//	js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "ORDERS_DLQ", Subjects: []string{"dlq.orders.>"}})
//	cons, _ := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
//		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy})
//	sink, _ := natsdedup.NewSink(js) // letters to "dlq." + the origin subject
//	w, _ := dedup.Wrap(store, natsdedup.Messages(), charge,
//		dedup.WithScope(dedup.Scope("billing", "charge")), dedup.WithSink(sink))
//	c, _ := natsdedup.NewConsumer(cons, w, natsdedup.WithJetStream(js)) // Health: nc lost, ORDERS_DLQ missing
//	err := c.Run(ctx) // until ctx is cancelled
package natsdedup
