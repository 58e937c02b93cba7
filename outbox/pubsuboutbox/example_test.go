package pubsuboutbox_test

import (
	"context"
	"fmt"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/pubsuboutbox"
)

// Publishing outbox events to Pub/Sub as a Relay does (here by hand,
// against pstest, the client library's in-process server; a relay is
// outbox.NewRelay(ob, pgConfig, pub)): each event's ID in the "event-id"
// attribute, where pubsubdedup.WithIDAttribute reads it, and its key as
// the ordering key.
func ExampleNewPublisher() {
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
	if _, err := client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/shop/topics/orders"}); err != nil {
		panic(err)
	}

	pub, err := pubsuboutbox.NewPublisher(client)
	if err != nil {
		panic(err)
	}
	defer pub.Stop()
	errs := pub.Publish(ctx, []outbox.Event{
		{ID: "order-1-created", Destination: "orders", Key: []byte("order-1"), Payload: []byte(`{"order":1}`)},
		{ID: "order-1-paid", Destination: "orders", Key: []byte("order-1"), Payload: []byte(`{"order":1,"paid":true}`)},
	})
	fmt.Println(errs)
	for _, m := range srv.Messages() {
		fmt.Println(m.OrderingKey, m.Attributes["event-id"])
	}
	// Output:
	// [<nil> <nil>]
	// order-1 order-1-created
	// order-1 order-1-paid
}
