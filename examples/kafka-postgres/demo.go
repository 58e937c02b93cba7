package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// startDemoCluster starts an in-process Kafka cluster (kfake) holding the
// topic and the dead-letter topic, and produces demo payments into it: about
// 20% of them re-sent (same event-id), two invalid (dead-lettered as
// permanent failures) and one without an event-id (dead-lettered as
// invalid-id).
func startDemoCluster(ctx context.Context, cfg config, log *slog.Logger) (brokers []string, stop func(), err error) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, cfg.topic, cfg.dlqTopic))
	if err != nil {
		return nil, nil, fmt.Errorf("start kfake: %w", err)
	}
	brokers = cluster.ListenAddrs()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		cluster.Close()
		return nil, nil, err
	}
	defer cl.Close()

	// Event IDs are new on every run, as the cluster is: the database keeps
	// the dedup records of earlier runs.
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	unique := max(cfg.demoEvents*4/5, 3)
	recs := make([]*kgo.Record, 0, cfg.demoEvents+1)
	for i := range unique {
		p := payment{Account: "acct-" + strconv.Itoa(rand.IntN(20)), Cents: int64(100 + rand.IntN(10000))}
		if i < 2 {
			p.Cents = -p.Cents
		}
		v, _ := json.Marshal(p)
		recs = append(recs, &kgo.Record{Topic: cfg.topic, Key: []byte(p.Account), Value: v,
			Headers: []kgo.RecordHeader{{Key: kafkadedup.DefaultIDHeader, Value: []byte("pay-" + run + "-" + strconv.Itoa(i))}}})
	}
	for len(recs) < cfg.demoEvents {
		orig := recs[rand.IntN(unique)]
		recs = append(recs, &kgo.Record{Topic: cfg.topic, Key: orig.Key, Value: orig.Value, Headers: orig.Headers})
	}
	recs = append(recs, &kgo.Record{Topic: cfg.topic, Key: []byte("acct-0"), Value: []byte(`{"account":"acct-0","cents":100}`)})
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		cluster.Close()
		return nil, nil, fmt.Errorf("produce demo payments: %w", err)
	}
	log.Info("kfake cluster started with demo payments", slog.Any("brokers", brokers),
		slog.Int("records", len(recs)), slog.Int("unique_events", unique), slog.Int("invalid", 3))
	return brokers, cluster.Close, nil
}
