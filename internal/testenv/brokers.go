package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultRabbitMQURL and DefaultNATSURL are the brokers tests use when
// DEDUP_RABBITMQ_URL or DEDUP_NATS_URL is unset: the machine's own servers
// (scripts/brokers.sh).
const (
	DefaultRabbitMQURL = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultNATSURL     = "nats://127.0.0.1:4222"
)

// RabbitMQURL returns the URL of the RabbitMQ at DEDUP_RABBITMQ_URL, once a
// connection to it succeeded, or reports RabbitMQ unavailable.
func RabbitMQURL(t testing.TB) string {
	t.Helper()
	url := Env("DEDUP_RABBITMQ_URL", DefaultRabbitMQURL)
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		Unavailable(t, "RabbitMQ", err)
		return ""
	}
	conn.Close()
	return url
}

// RabbitMQ returns a connection to the RabbitMQ at DEDUP_RABBITMQ_URL,
// closed when t ends, or reports RabbitMQ unavailable.
func RabbitMQ(t testing.TB) *amqp.Connection {
	t.Helper()
	url := RabbitMQURL(t)
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("RabbitMQ at %s: %v", url, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// NATSURL returns the URL of the NATS server at DEDUP_NATS_URL, once it
// answered with JetStream enabled, or reports NATS unavailable.
func NATSURL(t testing.TB) string {
	t.Helper()
	url := Env("DEDUP_NATS_URL", DefaultNATSURL)
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second), nats.MaxReconnects(0))
	if err != nil {
		Unavailable(t, "NATS", err)
		return ""
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
	}
	if err != nil {
		Unavailable(t, "NATS JetStream", err)
		return ""
	}
	return url
}

// NATS returns a connection to the NATS server at DEDUP_NATS_URL, closed
// when t ends, and its JetStream context, or reports NATS unavailable.
func NATS(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	url := NATSURL(t)
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("NATS at %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("NATS JetStream: %v", err)
	}
	return nc, js
}
