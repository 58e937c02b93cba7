package main

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup/internal/testenv"
)

// TestMain lets the test binary serve as a row's subprocess, as the
// dedupbench binary does.
func TestMain(m *testing.M) {
	if childMain() {
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestSmoke runs one row of each kind with a few hundred events: each must
// consume them all, with one effect per distinct event, and the JSON must
// list them. (-quick runs them all; this stays within a few seconds.)
func TestSmoke(t *testing.T) {
	testenv.Postgres(t)
	testenv.DynamoDB(t)
	testenv.SQS(t)
	testenv.Redis(t)
	amqpURL, natsURL := testenv.RabbitMQURL(t), testenv.NATSURL(t)
	p := plan{
		cfg: config{
			Postgres:            testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN),
			DynamoDB:            testenv.Env("DEDUP_DYNAMODB_ENDPOINT", "http://127.0.0.1:8000"),
			SQS:                 testenv.Env("DEDUP_SQS_ENDPOINT", "http://127.0.0.1:4566"),
			Redis:               testenv.Env("DEDUP_REDIS_ADDR", testenv.DefaultRedisAddr),
			AMQP:                amqpURL,
			NATS:                natsURL,
			Partitions:          2,
			BatchWait:           50 * time.Millisecond,
			FetchPartitionBytes: 128 << 10,
		},
		n: 400, smallN: 50, dup: 0.2,
		only: []string{"none", "batched", "redis-batched", "floor", "dynamodb", "dynamodb-floor", "sqs", "sqs-none",
			"amqp-none", "amqp", "amqp-quorum-none", "amqp-quorum", "nats-none", "nats", "redisstreams-none", "redisstreams",
			"lambdastream-none", "lambdastream", "pubsub-none", "pubsub"},
	}
	out := filepath.Join(t.TempDir(), "results.json")
	if err := p.run(t.Context(), out, false); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep report
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, r := range rep.Results {
		seen[r.Row]++
		if r.EventsPerSec <= 0 || r.PeakRSSMiB <= 0 {
			t.Errorf("row %s (N=%d): %+v", r.Row, r.Records, r)
		}
	}
	for _, name := range p.only {
		if seen[name] == 0 {
			t.Errorf("row %s missing from the results", name)
		}
	}
	// Each broker row deleted the queue or stream it made.
	for _, r := range rep.Results {
		if r.Row == "amqp" || r.Row == "nats" || strings.HasPrefix(r.Row, "amqp-") || strings.HasPrefix(r.Row, "nats-") {
			if r.Queue == "" {
				t.Errorf("row %s names no queue or stream", r.Row)
			} else if exists(t, r.Row, r.Queue, amqpURL, natsURL) {
				t.Errorf("row %s left its queue or stream %s", r.Row, r.Queue)
			}
		}
	}
	// Each row is measured against its own floor, which is 1x itself.
	for _, r := range rep.Results {
		if r.Row == floorOf(r.Row) && math.Abs(r.RatioToFloor-1) > 1e-9 {
			t.Errorf("floor row %s (N=%d) has ratio %v to itself", r.Row, r.Records, r.RatioToFloor)
		}
		if r.RatioToFloor <= 0 {
			t.Errorf("row %s (N=%d) has no ratio to %s", r.Row, r.Records, floorOf(r.Row))
		}
	}
}

// exists reports whether the queue (RabbitMQ rows) or the stream (NATS
// rows) a row named is still there.
func exists(t *testing.T, row, name, amqpURL, natsURL string) bool {
	t.Helper()
	if strings.HasPrefix(row, "nats") {
		nc, err := nats.Connect(natsURL)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		_, err = js.Stream(t.Context(), name)
		if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	_, err = ch.QueueDeclarePassive(name, true, false, false, false, nil)
	var amqpErr *amqp.Error
	if err != nil && !(errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound) {
		t.Fatal(err)
	}
	return err == nil
}

// TestEventOrder checks the deliveries every transport's rows are filled
// with: records of them, every event at least once, no other, and the same
// order on every call.
func TestEventOrder(t *testing.T) {
	const records, unique = 1000, 800
	order := eventOrder(records, unique)
	seen := map[int]int{}
	for _, i := range order {
		seen[i]++
	}
	if len(order) != records || len(seen) != unique {
		t.Fatalf("%d deliveries of %d events, want %d of %d", len(order), len(seen), records, unique)
	}
	for i := range unique {
		if seen[i] == 0 {
			t.Fatalf("event %d never delivered", i)
		}
	}
	if !slices.Equal(order, eventOrder(records, unique)) {
		t.Fatal("two calls gave two orders")
	}
}
