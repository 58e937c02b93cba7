package pubsubdedup_test

import (
	"context"
	"fmt"
	"sync/atomic"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/pubsubdedup"
)

// A consumer of a subscription whose handler runs once per event: the
// event published twice (a producer's retry: two message IDs, one
// "event-id") is charged once, both messages acknowledged. Here against
// pstest, the client library's in-process server; in production
// pubsub.NewClient(ctx, project) alone.
func ExampleNewConsumer() {
	ctx := context.Background()
	srv := pstest.NewServer()
	defer srv.Close()
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client, err := pubsub.NewClient(ctx, "shop", option.WithGRPCConn(conn))
	if err != nil {
		panic(err)
	}
	defer client.Close()
	for _, topic := range []string{"projects/shop/topics/orders", "projects/shop/topics/orders-dlq"} {
		if _, err := client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
			panic(err)
		}
	}
	if _, err := client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: "projects/shop/subscriptions/billing", Topic: "projects/shop/topics/orders", AckDeadlineSeconds: 30,
	}); err != nil {
		panic(err)
	}

	sink, err := pubsubdedup.NewSink(client, "orders-dlq")
	if err != nil {
		panic(err)
	}
	defer sink.Stop()
	var charged, settled atomic.Int32
	done := make(chan struct{})
	charge := func(ctx context.Context, m *pubsub.Message) error { // the business effect
		charged.Add(1)
		return nil
	}
	w, err := dedup.Wrap(dedup.NewMemoryStore(), pubsubdedup.Messages(pubsubdedup.WithIDAttribute("event-id")), charge,
		dedup.WithScope(dedup.Scope("billing", "charge")), dedup.WithSink(sink),
		dedup.WithObserver(func(context.Context, dedup.Result) {
			if settled.Add(1) == 2 {
				close(done)
			}
		}))
	if err != nil {
		panic(err)
	}
	consumer, err := pubsubdedup.NewConsumer(client, "billing", w)
	if err != nil {
		panic(err)
	}
	for range 2 {
		srv.Publish("projects/shop/topics/orders", []byte(`{"order":1,"cents":4200}`), map[string]string{"event-id": "order-1"})
	}
	ctx, cancel := context.WithCancel(ctx)
	go func() { <-done; cancel() }()
	if err := consumer.Run(ctx); err != nil { // until ctx is done
		panic(err)
	}
	fmt.Println("charged:", charged.Load())
	// Output: charged: 1
}
