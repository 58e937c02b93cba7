package kafkadedup_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
)

// A consumer group member whose handler runs once per event: the order sent
// twice (a producer's retry) is charged once. An in-process Kafka cluster
// (kfake) and the memory store stand in for a broker and PostgreSQL.
func ExampleConsumer() {
	cluster, err := kfake.NewCluster(kfake.SeedTopics(1, "orders", "orders.dlq"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	brokers := kgo.SeedBrokers(cluster.ListenAddrs()...)

	producer, err := kgo.NewClient(brokers)
	if err != nil {
		panic(err)
	}
	defer producer.Close()
	order := func(id string) *kgo.Record {
		return &kgo.Record{Topic: "orders", Value: []byte(`{"amount":42}`),
			Headers: []kgo.RecordHeader{{Key: kafkadedup.DefaultIDHeader, Value: []byte(id)}}}
	}
	if err := producer.ProduceSync(context.Background(), order("order-1"), order("order-1"), order("order-2")).FirstErr(); err != nil {
		panic(err)
	}

	sink, err := kafkadedup.NewSink(producer) // dead letters to "orders.dlq"
	if err != nil {
		panic(err)
	}
	var charged, settled atomic.Int64
	charge := func(ctx context.Context, r *kgo.Record) error {
		charged.Add(1)
		return nil
	}
	w, err := dedup.Wrap(dedup.NewMemoryStore(), kafkadedup.Messages(), charge,
		dedup.WithScope(dedup.Scope("billing", "charge")), dedup.WithSink(sink),
		dedup.WithObserver(func(context.Context, dedup.Result) { settled.Add(1) }))
	if err != nil {
		panic(err)
	}
	consumer, err := kafkadedup.NewConsumer(w,
		kafkadedup.WithClientOpts(brokers, kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("orders"),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())),
		kafkadedup.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		panic(err)
	}

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- consumer.Run(ctx) }()
	for settled.Load() < 3 {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		panic(err)
	}
	fmt.Println("records settled:", settled.Load(), "charges:", charged.Load())
	// Output: records settled: 3 charges: 2
}
