package main

import (
	"context"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/pubsubdedup"
	"github.com/dedupkit/dedup/internal/pubsubenv"
	"github.com/dedupkit/dedup/internal/wire"
)

// runPubSub consumes a subscription of an in-process pstest server through
// pubsubdedup.Consumer with its defaults (each message claimed, handled
// and completed on its own, in the client's callback) over PostgreSQL.
func runPubSub(ctx context.Context, cfg config, m *meter) error {
	client, sub, drop, err := openSubscription(ctx, cfg)
	if err != nil {
		return err
	}
	defer drop()
	store, _, closeStore, err := openPostgresStore(ctx, cfg, m, "pubsub")
	if err != nil {
		return err
	}
	defer closeStore()
	msgs := pubsubdedup.Messages(pubsubdedup.WithIDAttribute(wire.PubSubIDAttribute))
	id := msgs.EventID
	msgs.EventID = func(msg *pubsub.Message) (string, error) {
		s, err := id(msg)
		if err == nil {
			m.entries.enter(s, now())
		}
		return s, err
	}
	w, err := dedup.Wrap(store, msgs, func(context.Context, *pubsub.Message) error { return nil }, wrapperOpts("pubsub", m)...)
	if err != nil {
		return err
	}
	c, err := pubsubdedup.NewConsumer(client, sub, w, pubsubdedup.WithInFlightDelay(200*time.Millisecond))
	if err != nil {
		return err
	}
	m.begin()
	m.started()
	return c.Run(ctx)
}

// runPubSubNone receives and acknowledges the subscription's messages with
// the client's Receive and its defaults, with no dedup: what pstest and the
// client cost on their own.
func runPubSubNone(ctx context.Context, cfg config, m *meter) error {
	client, sub, drop, err := openSubscription(ctx, cfg)
	if err != nil {
		return err
	}
	defer drop()
	m.begin()
	m.started()
	return client.Subscriber(sub).Receive(ctx, func(_ context.Context, msg *pubsub.Message) {
		msg.Ack()
		m.settle(dedup.OutcomeProcessed, 1)
	})
}

// openSubscription starts a pstest server in this process holding the
// row's events in a topic, and returns a client of it (over gRPC, as a
// remote one would be), the subscription's name, and a function that
// stops them.
func openSubscription(ctx context.Context, cfg config) (*pubsub.Client, string, func(), error) {
	srv := pstest.NewServer()
	client, closeClient, err := pubsubenv.Dial(ctx, srv.Addr, "dedupbench")
	if err != nil {
		_ = srv.Close()
		return nil, "", nil, err
	}
	drop := func() {
		closeClient()
		_ = srv.Close()
	}
	const topic, sub = "projects/dedupbench/topics/events", "projects/dedupbench/subscriptions/bench"
	if _, err := client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
		drop()
		return nil, "", nil, err
	}
	if _, err := client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: sub, Topic: topic,
		AckDeadlineSeconds: 30}); err != nil {
		drop()
		return nil, "", nil, err
	}
	for _, i := range eventOrder(cfg.Records, cfg.Unique) {
		srv.Publish(topic, eventBody(i), map[string]string{wire.PubSubIDAttribute: eventID(i)})
	}
	return client, sub, drop, nil
}
