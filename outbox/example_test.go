package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/kafkaoutbox"
)

// exampleSchema is where this test process's examples keep their tables,
// so that two test runs side by side do not drop each other's; TestMain
// drops it.
var exampleSchema = fmt.Sprintf("outbox_examples_%d", os.Getpid())

// exampleDB connects to DEDUP_POSTGRES_DSN, the examples' tables in
// exampleSchema; they need PostgreSQL.
func exampleDB(ctx context.Context) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN))
	if err == nil {
		cfg.ConnConfig.RuntimeParams["search_path"] = exampleSchema
		var pool *pgxpool.Pool
		if pool, err = pgxpool.NewWithConfig(ctx, cfg); err == nil {
			if _, err = pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+exampleSchema); err == nil {
				return pool
			}
			pool.Close()
		}
	}
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
	return nil
}

// dropExampleSchema drops the examples' schema, if they made it.
func dropExampleSchema() {
	pool, err := pgxpool.New(context.Background(), testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN))
	if err != nil {
		return
	}
	defer pool.Close()
	_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+exampleSchema+" CASCADE")
}

// An order and its event are written in one transaction: the event is
// published if and only if the order commits.
func ExampleOutbox_Add() {
	ctx := context.Background()
	pool := exampleDB(ctx)
	defer pool.Close()
	ob, _ := outbox.New(outbox.WithTable("example_add_events"))
	_, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS example_add_events")
	if err := ob.Migrate(ctx, pool); err != nil {
		fmt.Println(err)
		return
	}

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... INSERT INTO orders ... in tx
		ids, err := ob.Add(ctx, tx, outbox.Event{
			ID:          "order-42-placed",
			Destination: "orders",
			Key:         []byte("order-42"),
			Payload:     []byte(`{"order":"42"}`),
		})
		fmt.Println("added", ids)
		return err
	})
	fmt.Println("committed:", err == nil)

	var status string
	_ = pool.QueryRow(ctx, "SELECT status FROM example_add_events WHERE event_id = 'order-42-placed'").Scan(&status)
	fmt.Println("status:", status)
	// Output:
	// added [order-42-placed]
	// committed: true
	// status: pending
}

// A relay publishes committed events to Kafka with the event ID in the
// "event-id" header, where kafkadedup reads it.
func ExampleNewRelay() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := exampleDB(ctx)
	defer pool.Close()
	ob, _ := outbox.New(outbox.WithTable("example_relay_events"))
	_, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS example_relay_events")
	if err := ob.Migrate(ctx, pool); err != nil {
		fmt.Println(err)
		return
	}
	_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := ob.Add(ctx, tx, outbox.Event{ID: "order-7-placed", Destination: "orders", Key: []byte("order-7"), Payload: []byte("placed")})
		return err
	})

	kc, _ := kfake.NewCluster(kfake.SeedTopics(1, "orders"))
	defer kc.Close()
	producer, _ := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...))
	defer producer.Close()
	pub, _ := kafkaoutbox.NewPublisher(producer)
	// The relay opens its own connections from the configuration.
	relay, err := outbox.NewRelay(ob, pool.Config(), pub)
	if err != nil {
		fmt.Println(err)
		return
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- relay.Run(rctx) }()

	consumer, _ := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.ConsumeTopics("orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	defer consumer.Close()
	fs := consumer.PollFetches(ctx)
	fs.EachRecord(func(r *kgo.Record) {
		for _, h := range r.Headers {
			fmt.Printf("%s: %s\n", h.Key, h.Value)
		}
		fmt.Printf("key %s, value %s\n", r.Key, r.Value)
	})
	stop()
	fmt.Println("relay stopped:", <-done)
	// Output:
	// event-id: order-7-placed
	// key order-7, value placed
	// relay stopped: <nil>
}

// A relay runs in the same binary as the HTTP server (and the consumer):
// the first of them to stop stops the others and its error ends the
// process, where a relay started with a bare `go relay.Run(ctx)` would die
// unseen. Here the relay's table was never migrated, so it stops at once
// with ErrNotMigrated, and the server is shut down with it.
func ExampleRelay_Run_oneBinary() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool := exampleDB(ctx)
	defer pool.Close()
	ob, _ := outbox.New(outbox.WithTable("example_never_migrated"))
	kc, _ := kfake.NewCluster(kfake.SeedTopics(1, "orders"))
	defer kc.Close()
	producer, _ := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...))
	defer producer.Close()
	pub, _ := kafkaoutbox.NewPublisher(producer)
	relay, _ := outbox.NewRelay(ob, pool.Config(), pub)

	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	srv := &http.Server{Handler: http.NotFoundHandler()}
	serve := func(ctx context.Context) error {
		go func() {
			<-ctx.Done()
			_ = srv.Shutdown(context.Background())
		}()
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}

	err := runAll(ctx, relay.Run, serve /* , consumer.Run */)
	fmt.Println("stopped:", errors.Is(err, outbox.ErrNotMigrated))
	// Output:
	// stopped: true
}

// runAll runs each function until the first returns, then cancels the
// others' context, waits for them, and returns the first error.
func runAll(ctx context.Context, runs ...func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(runs))
	for _, run := range runs {
		go func() { errs <- run(ctx) }()
	}
	var first error
	for range runs {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
		cancel()
	}
	return first
}
