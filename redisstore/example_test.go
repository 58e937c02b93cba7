package redisstore_test

import (
	"context"
	"crypto/rand"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/redisstore"
)

// Order is a transport's native message type in this example.
type Order struct {
	ID      string // the producer-assigned event ID
	Payload string
}

func Example() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}) // or a ClusterClient, a FailoverClient
	defer client.Close()
	store, err := redisstore.New(client)
	if err != nil {
		fmt.Println(err)
		return
	}
	orders := dedup.Messages[Order]{
		EventID:    func(o Order) (string, error) { return o.ID, nil },
		Payload:    func(o Order) []byte { return []byte(o.Payload) },
		DeadLetter: func(o Order) dedup.DeadLetter { return dedup.DeadLetter{Payload: []byte(o.Payload)} },
	}
	charged := 0
	w, err := dedup.Wrap(store, orders,
		func(ctx context.Context, o Order) error {
			charged++ // the business effect
			return nil
		},
		// The example runs again and again: a scope of its own each time.
		dedup.WithScope("billing/charge-card/"+rand.Text()),
		dedup.WithSink(dedup.NewMemorySink()),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	// The broker delivers the same event three times.
	for range 3 {
		res, err := w.Handle(context.Background(), Order{ID: "order-42", Payload: `{"amount":10}`})
		if err != nil {
			fmt.Println("not acked:", err) // Redis unreachable: do not ack, it comes back
			return
		}
		fmt.Println(res.Outcome, "ack:", res.Settled())
	}
	fmt.Println("charged", charged, "time")
	// Output:
	// processed ack: true
	// duplicate ack: true
	// duplicate ack: true
	// charged 1 time
}
