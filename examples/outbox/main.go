// Command outbox is an order service with a transactional outbox, end to
// end: each order and its "order placed" event are written in one PostgreSQL
// transaction; two relays publish the committed events to Kafka; a shipping
// consumer downstream applies each event once with dedup.WrapTx. Kafka is an
// in-process kfake cluster; PostgreSQL is the one at DEDUP_POSTGRES_DSN
// (or -dsn), which the outbox needs: the event must be a row in the same
// database transaction as the order, so there is no honest stand-in.
//
//	DEDUP_POSTGRES_DSN=postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable go run ./examples/outbox
//
// It places 200 orders, a quarter of which fail and roll back, waits until
// every committed order is shipped, then makes the relays publish everything
// again (as relays killed after publishing and before marking would) and
// shows that the consumer ships nothing twice.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/kafkaoutbox"
)

const topic = "orders"

func main() {
	dsn := flag.String("dsn", os.Getenv("DEDUP_POSTGRES_DSN"), "PostgreSQL DSN (default $DEDUP_POSTGRES_DSN)")
	orders := flag.Int("orders", 200, "orders to place")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if *dsn == "" {
		fmt.Fprintln(os.Stderr, "examples/outbox needs PostgreSQL: set DEDUP_POSTGRES_DSN (or -dsn), e.g.\n"+
			"  DEDUP_POSTGRES_DSN='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable' go run ./examples/outbox\n"+
			"(`make services` starts one. The example drops and recreates its own example_* tables.)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *dsn, *orders, log); err != nil {
		fmt.Fprintln(os.Stderr, "outbox example:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dsn string, n int, log *slog.Logger) error {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("PostgreSQL at DEDUP_POSTGRES_DSN: %w", err)
	}
	ob, err := outbox.New(outbox.WithTable("example_order_events"))
	if err != nil {
		return err
	}
	if err := setup(ctx, pool, ob); err != nil {
		return err
	}

	kc, err := kfake.NewCluster(kfake.SeedTopics(4, topic, topic+".dlq"))
	if err != nil {
		return err
	}
	defer kc.Close()
	brokers := kc.ListenAddrs()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 3)

	// Two relays, as two replicas of a deployment would run. Each opens its
	// own connections from the configuration: never the service's pool.
	producer, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer producer.Close()
	pub, err := kafkaoutbox.NewPublisher(producer)
	if err != nil {
		return err
	}
	for range 2 {
		relay, err := outbox.NewRelay(ob, pool.Config(), pub, outbox.WithLogger(log))
		if err != nil {
			return err
		}
		go func() { done <- relay.Run(ctx) }()
	}

	// Downstream: shipping applies each "order placed" event once, in the
	// transaction holding its dedup record.
	var duplicates atomic.Int64
	consumer, err := shippingConsumer(pool, brokers, log, &duplicates)
	if err != nil {
		return err
	}
	go func() { done <- consumer.Run(ctx) }()

	committed, rolledBack := 0, 0
	for i := range n {
		switch err := placeOrder(ctx, pool, ob, fmt.Sprintf("order-%d", i), i%4 == 3); {
		case errors.Is(err, errOutOfStock):
			rolledBack++
		case err != nil:
			return err
		default:
			committed++
		}
	}
	fmt.Printf("placed %d orders: %d committed, %d rolled back (out of stock)\n", n, committed, rolledBack)
	if err := waitShipped(ctx, pool, committed); err != nil {
		return err
	}
	fmt.Printf("shipped %d orders, one shipment each\n", shipments(ctx, pool))

	// As if every relay had died after the broker's acknowledgement and
	// before marking the rows: they are published again.
	tag, err := pool.Exec(ctx, "UPDATE example_order_events SET status = 'pending', sent_at = NULL")
	if err != nil {
		return err
	}
	if err := waitFor(ctx, "republished events seen by the consumer", duplicates.Load, tag.RowsAffected()); err != nil {
		return err
	}
	fmt.Printf("republished %d events: the consumer skipped %d duplicates, still %d shipments\n",
		tag.RowsAffected(), duplicates.Load(), shipments(ctx, pool))

	cancel()
	for range 3 {
		if err := <-done; err != nil {
			return err
		}
	}
	return nil
}

var errOutOfStock = errors.New("out of stock")

// placeOrder writes the order and its event in one transaction. When the
// order fails after the event was added, the rollback takes the event too.
func placeOrder(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, id string, outOfStock bool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO example_orders (id) VALUES ($1)", id); err != nil {
			return err
		}
		if _, err := ob.Add(ctx, tx, outbox.Event{
			Destination: topic,
			Key:         []byte(id), // the order's events stay in order
			Payload:     fmt.Appendf(nil, `{"order":%q}`, id),
		}); err != nil {
			return err
		}
		if outOfStock {
			return errOutOfStock
		}
		return nil
	})
}

func shippingConsumer(pool *pgxpool.Pool, brokers []string, log *slog.Logger, duplicates *atomic.Int64) (*kafkadedup.Consumer, error) {
	store, err := dedup.NewPostgresStore(pool, dedup.WithTable("example_shipping_dedup"))
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(context.Background()); err != nil {
		return nil, err
	}
	dlq, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return nil, err
	}
	sink, err := kafkadedup.NewSink(dlq)
	if err != nil {
		return nil, err
	}
	w, err := dedup.WrapTx(store, kafkadedup.Messages(), func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		_, err := tx.Exec(ctx, "INSERT INTO example_shipments (order_key) VALUES ($1)", string(r.Key))
		return err
	}, dedup.WithScope(dedup.Scope("shipping", "ship-order")), dedup.WithSink(sink), dedup.WithLogger(log),
		dedup.WithObserver(func(_ context.Context, res dedup.Result) {
			if res.Outcome == dedup.OutcomeDuplicate {
				duplicates.Add(1)
			}
		}))
	if err != nil {
		return nil, err
	}
	return kafkadedup.NewConsumer(w, kafkadedup.WithLogger(log), kafkadedup.WithClientOpts(
		kgo.SeedBrokers(brokers...), kgo.ConsumerGroup("shipping"), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())))
}

// setup creates the example's tables afresh and the outbox table.
func setup(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox) error {
	for _, q := range []string{
		"DROP TABLE IF EXISTS example_orders, example_shipments, example_order_events, example_shipping_dedup",
		"CREATE TABLE example_orders (id text PRIMARY KEY)",
		"CREATE TABLE example_shipments (order_key text NOT NULL)",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return err
		}
	}
	return ob.Migrate(ctx, pool)
}

func shipments(ctx context.Context, pool *pgxpool.Pool) int {
	var n int
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM example_shipments").Scan(&n)
	return n
}

func waitShipped(ctx context.Context, pool *pgxpool.Pool, want int) error {
	return waitFor(ctx, "orders shipped", func() int64 { return int64(shipments(ctx, pool)) }, int64(want))
}

// stall is how long waitFor waits with no progress before it gives up: the
// relays or the consumer are stuck, not slow (a busy machine is slow).
const stall = 2 * time.Minute

// waitFor waits until count reaches want, as long as it keeps moving.
func waitFor(ctx context.Context, what string, count func() int64, want int64) error {
	last, moved := count(), time.Now()
	for n := last; n < want; n = count() {
		if n != last {
			last, moved = n, time.Now()
		}
		if time.Since(moved) > stall {
			return fmt.Errorf("%s: %d of %d, none more in %v", what, n, want, stall)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}
