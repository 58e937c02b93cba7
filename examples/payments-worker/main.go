// Command payments-worker is the one binary a payments team runs, with each
// part set up as it should be on the first day:
//
//   - a RabbitMQ quorum queue of payments, consumed with dedup.WrapTx: the
//     payment row, its dedup record and its outbox event commit in one
//     PostgreSQL transaction, and poison messages go to "<queue>.dlq";
//   - POST /refunds behind idemhttp.NewTx on the same pool: a retried
//     request is answered with the first answer, never refunded twice;
//   - an outbox relay publishing the events to NATS JetStream;
//   - GET /readyz serving the Health of all three.
//
// It declares what it consumes and publishes to: both queues (the
// dead-letter queue too: without it a poison message cannot be parked) and
// the JetStream stream. It needs PostgreSQL, RabbitMQ and NATS with
// JetStream (`make services` starts what the machine lacks):
//
//	go run ./examples/payments-worker          # serve on 127.0.0.1:8080
//	go run ./examples/payments-worker -demo    # duplicates, poison, retried refunds; then exit
//
// -demo exits 0 only when every payment and refund was applied once, the
// poison message is in the dead-letter queue, and every event reached the
// stream once.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/amqpdedup"
	"github.com/dedupkit/dedup/idemhttp"
	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/natsoutbox"
)

// config is where the worker's services are and what it names there.
type config struct {
	postgres, rabbitmq, nats string
	queue                    string // payments; its letters go to queue+".dlq"
	stream                   string // the JetStream stream of the events
	subject                  string // the events' subject prefix
	prefetch                 int    // deliveries in flight, each holding a transaction
}

func main() {
	var cfg config
	flag.StringVar(&cfg.postgres, "postgres", env("DEDUP_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL DSN")
	flag.StringVar(&cfg.rabbitmq, "rabbitmq", env("DEDUP_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL")
	flag.StringVar(&cfg.nats, "nats", env("DEDUP_NATS_URL", nats.DefaultURL), "NATS URL")
	flag.StringVar(&cfg.queue, "queue", "example-payments", "the payments queue")
	flag.StringVar(&cfg.stream, "stream", "EXAMPLE_PAYMENTS", "the JetStream stream of the events")
	flag.StringVar(&cfg.subject, "subject", "example.payments", "the events' subject prefix")
	flag.IntVar(&cfg.prefetch, "prefetch", 50, "RabbitMQ deliveries in flight")
	addr := flag.String("addr", "127.0.0.1:8080", "HTTP address")
	demo := flag.Bool("demo", false, "run the demo against the worker, then exit")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := serve(ctx, cfg, *addr, *demo, log); err != nil {
		fmt.Fprintln(os.Stderr, "payments-worker:", err)
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// serve starts the worker on addr and runs until ctx is done, or, with
// demo, until the demo has run.
func serve(ctx context.Context, cfg config, addr string, demo bool, log *slog.Logger) error {
	wk, err := start(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer wk.close()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: wk.mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	if demo {
		return runDemo(ctx, wk, "http://"+ln.Addr().String())
	}
	fmt.Printf("payments-worker: consuming %s, serving http://%s (POST /refunds, GET /readyz)\n", cfg.queue, ln.Addr())
	<-ctx.Done()
	return nil
}

// worker is the running binary: its pool, its HTTP routes and the
// goroutines of the consumer and the relay.
type worker struct {
	cfg  config
	pool *pgxpool.Pool
	nc   *nats.Conn
	js   jetstream.JetStream
	mux  *http.ServeMux
	// duplicates counts the deliveries answered as duplicates.
	duplicates atomic.Int64
	cancel     context.CancelFunc
	done       chan error
}

// start declares what the worker needs, then starts the consumer and the
// relay.
func start(ctx context.Context, cfg config, log *slog.Logger) (_ *worker, err error) {
	pgcfg, err := pgxpool.ParseConfig(cfg.postgres)
	if err != nil {
		return nil, err
	}
	// One pool for the consumer and the API (docs/consuming.md, "One pool
	// for the consumer and the API"): the inbox's transactions hold at most
	// store.TxConns() of it, 15 of 20 by default, however many deliveries
	// the prefetch brings; the other 5 serve the refunds, the outbox's
	// writes and the store's own queries.
	pgcfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, pgcfg)
	if err != nil {
		return nil, err
	}
	wk := &worker{cfg: cfg, pool: pool, mux: http.NewServeMux(), done: make(chan error, 2)}
	defer func() {
		if err != nil {
			wk.close()
		}
	}()
	if err := pool.Ping(ctx); err != nil {
		return nil, fmt.Errorf("PostgreSQL: %w", err)
	}
	ob, err := outbox.New(outbox.WithTable("example_worker_events"))
	if err != nil {
		return nil, err
	}
	store, err := dedup.NewPostgresStore(pool, dedup.WithTable("example_worker_dedup"))
	if err != nil {
		return nil, err
	}
	if err := setupTables(ctx, pool, ob, store); err != nil {
		return nil, err
	}
	if err := declareQueues(cfg); err != nil {
		return nil, err
	}
	if wk.nc, err = nats.Connect(cfg.nats); err != nil {
		return nil, fmt.Errorf("NATS: %w", err)
	}
	if wk.js, err = jetstream.New(wk.nc); err != nil {
		return nil, err
	}
	if _, err := wk.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: cfg.stream, Subjects: []string{cfg.subject + ".>"}, Duplicates: 10 * time.Minute,
	}); err != nil {
		return nil, fmt.Errorf("JetStream stream %s: %w", cfg.stream, err)
	}

	consumer, err := paymentsConsumer(cfg, store, ob, log, &wk.duplicates)
	if err != nil {
		return nil, err
	}
	refunds, err := idemhttp.NewTx(store, pool, idemhttp.WithScope("payments/refund"), idemhttp.WithLogger(log))
	if err != nil {
		return nil, err
	}
	pub, err := natsoutbox.NewPublisher(wk.js)
	if err != nil {
		return nil, err
	}
	// The relay opens connections of its own from the configuration, so
	// that publishing never waits for the pool the work holds.
	relay, err := outbox.NewRelay(ob, pool.Config(), pub, outbox.WithLogger(log))
	if err != nil {
		return nil, err
	}

	wk.mux.Handle("POST /refunds", refunds.Wrap(refundHandler(ob, cfg.subject)))
	wk.mux.Handle("GET /readyz", dedup.ReadinessHandler(consumer, refunds, relay))

	ctx, wk.cancel = context.WithCancel(context.Background())
	go func() { wk.done <- consumer.Run(ctx) }()
	go func() { wk.done <- relay.Run(ctx) }()
	return wk, nil
}

// close stops the consumer and the relay, and waits for them.
func (wk *worker) close() {
	if wk.cancel != nil {
		wk.cancel()
		for range 2 {
			<-wk.done
		}
	}
	if wk.nc != nil {
		wk.nc.Close()
	}
	wk.pool.Close()
}

// setupTables creates the worker's tables afresh, the dedup records' and
// the outbox's.
func setupTables(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, store *dedup.PostgresStore) error {
	for _, q := range []string{
		"DROP TABLE IF EXISTS example_worker_payments, example_worker_refunds, example_worker_events, example_worker_dedup",
		"CREATE TABLE example_worker_payments (id text PRIMARY KEY, amount bigint NOT NULL)",
		"CREATE TABLE example_worker_refunds (id bigserial PRIMARY KEY, payment text NOT NULL, amount bigint NOT NULL)",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return err
		}
	}
	if err := ob.Migrate(ctx, pool); err != nil {
		return err
	}
	return store.Migrate(ctx)
}

// declareQueues declares the payments queue and its dead-letter queue,
// both quorum queues: a quorum queue counts redeliveries, which the
// consumer reads as attempts.
func declareQueues(cfg config) error {
	conn, err := amqp.Dial(cfg.rabbitmq)
	if err != nil {
		return fmt.Errorf("RabbitMQ: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	quorum := amqp.Table{"x-queue-type": "quorum"}
	for _, q := range []string{cfg.queue, cfg.queue + ".dlq"} {
		if _, err := ch.QueueDeclare(q, true, false, false, false, quorum); err != nil {
			return fmt.Errorf("declare queue %s: %w", q, err)
		}
	}
	return nil
}

// payment is a message of the payments queue, whose message_id is the
// payment's ID.
type payment struct {
	Amount int64 `json:"amount"`
}

// paymentsConsumer records each payment once, with its event, in the
// transaction holding its dedup record.
func paymentsConsumer(cfg config, store *dedup.PostgresStore, ob *outbox.Outbox, log *slog.Logger, duplicates *atomic.Int64) (*amqpdedup.Consumer, error) {
	sink, err := amqpdedup.NewSink(cfg.rabbitmq) // letters to <queue>.dlq
	if err != nil {
		return nil, err
	}
	record := func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		var p payment
		if err := json.Unmarshal(d.Body, &p); err != nil || p.Amount <= 0 {
			return dedup.Permanent(fmt.Errorf("not a payment: %q", d.Body))
		}
		if _, err := tx.Exec(ctx, "INSERT INTO example_worker_payments (id, amount) VALUES ($1, $2)", d.MessageId, p.Amount); err != nil {
			return err
		}
		_, err := ob.Add(ctx, tx, outbox.Event{
			Destination: cfg.subject + ".recorded",
			Key:         []byte(d.MessageId),
			Payload:     d.Body,
		})
		return err
	}
	w, err := dedup.WrapTx(store, amqpdedup.Messages(cfg.queue), record,
		dedup.WithScope(dedup.Scope("payments", "record")), dedup.WithSink(sink), dedup.WithLogger(log),
		dedup.WithObserver(func(_ context.Context, res dedup.Result) {
			if res.Outcome == dedup.OutcomeDuplicate {
				duplicates.Add(1)
			}
		}))
	if err != nil {
		return nil, err
	}
	return amqpdedup.NewConsumer(cfg.rabbitmq, cfg.queue, w, amqpdedup.WithPrefetch(cfg.prefetch), amqpdedup.WithLogger(log))
}

// refund is the body of POST /refunds.
type refund struct {
	Payment string `json:"payment"`
	Amount  int64  `json:"amount"`
}

// refundHandler records a refund and its event in the transaction holding
// the request's key, and answers 201 with the refund's ID.
func refundHandler(ob *outbox.Outbox, subject string) idemhttp.TxHandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) {
		var rf refund
		if err := json.NewDecoder(r.Body).Decode(&rf); err != nil || rf.Payment == "" || rf.Amount <= 0 {
			http.Error(w, "a refund needs a payment and a positive amount", http.StatusUnprocessableEntity)
			return
		}
		var id int64
		err := tx.QueryRow(r.Context(), "INSERT INTO example_worker_refunds (payment, amount) VALUES ($1, $2) RETURNING id",
			rf.Payment, rf.Amount).Scan(&id)
		if err == nil {
			body, _ := json.Marshal(map[string]any{"refund": id, "payment": rf.Payment, "amount": rf.Amount})
			_, err = ob.Add(r.Context(), tx, outbox.Event{Destination: subject + ".refunded", Key: []byte(rf.Payment), Payload: body})
		}
		if err != nil {
			http.Error(w, "refund not recorded", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"refund":%d}`+"\n", id)
	}
}

var errDemo = errors.New("demo check failed")
