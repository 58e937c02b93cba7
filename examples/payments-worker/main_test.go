package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup/internal/testenv"
)

// TestDemo runs the -demo session against the machine's PostgreSQL (in a
// schema of its own, so that a second run beside it keeps its tables),
// RabbitMQ and NATS, under names of its own; the demo's own checks (each
// payment, refund and event once, the poison message dead-lettered,
// /readyz ready) decide the result.
func TestDemo(t *testing.T) {
	_, dsn := testenv.PostgresInSchema(t) // each reports its service missing: under CI=true, a failure
	name := fmt.Sprintf("example-worker-%d-%d", os.Getpid(), time.Now().UnixNano())
	cfg := config{
		postgres: dsn,
		rabbitmq: testenv.RabbitMQURL(t),
		nats:     testenv.NATSURL(t),
		queue:    name,
		stream:   fmt.Sprintf("EXAMPLE_WORKER_%d_%d", os.Getpid(), time.Now().UnixNano()),
		subject:  fmt.Sprintf("example.worker.%d", time.Now().UnixNano()),
		prefetch: 16,
	}
	t.Cleanup(func() { cleanup(t, cfg) })
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := serve(context.Background(), cfg, "127.0.0.1:0", true, log); err != nil {
		t.Fatal(err)
	}
}

// cleanup deletes the test's queues and stream.
func cleanup(t *testing.T, cfg config) {
	if conn, err := amqp.Dial(cfg.rabbitmq); err == nil {
		if ch, err := conn.Channel(); err == nil {
			for _, q := range []string{cfg.queue, cfg.queue + ".dlq"} {
				if _, err := ch.QueueDelete(q, false, false, false); err != nil {
					t.Logf("delete queue %s: %v", q, err)
				}
			}
		}
		conn.Close()
	}
	if nc, err := nats.Connect(cfg.nats); err == nil {
		if js, err := jetstream.New(nc); err == nil {
			_ = js.DeleteStream(context.Background(), cfg.stream)
		}
		nc.Close()
	}
}
