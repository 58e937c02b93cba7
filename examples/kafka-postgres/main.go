// Command kafka-postgres is a payments worker as a team would deploy it: it
// consumes payment events from Kafka and applies each one to PostgreSQL
// exactly once, with the transactional inbox (dedup.WrapTx): the payment row,
// the balance update and the dedup record commit in one transaction. Poison
// events go to a dead-letter topic; SIGINT/SIGTERM shut it down gracefully.
//
// Configuration comes from flags, each defaulting to an environment variable:
//
//	-brokers   KAFKA_BROKERS    comma-separated seed brokers (localhost:9092)
//	-group     KAFKA_GROUP      consumer group (payments-worker)
//	-topic     KAFKA_TOPIC      topic to consume (payments)
//	-dlq-topic KAFKA_DLQ_TOPIC  dead-letter topic (<topic>.dlq)
//	-dsn       DATABASE_URL     PostgreSQL (or DEDUP_POSTGRES_DSN)
//
// With -kfake it starts an in-process Kafka cluster and produces demo
// payments into it instead of connecting to brokers. See README.md.
package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

//go:embed schema.sql
var schema string

// handlerName is part of every dedup key: keep it stable across releases.
const handlerName = "apply-payment"

type config struct {
	brokers     []string
	group       string
	topic       string
	dlqTopic    string
	dsn         string
	maxAttempts int
	migrate     bool
	kfake       bool
	demoEvents  int
	logLevel    slog.Level
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func parseFlags() config {
	var c config
	brokers := flag.String("brokers", env("KAFKA_BROKERS", "localhost:9092"), "comma-separated seed brokers")
	flag.StringVar(&c.group, "group", env("KAFKA_GROUP", "payments-worker"), "consumer group")
	flag.StringVar(&c.topic, "topic", env("KAFKA_TOPIC", "payments"), "topic to consume")
	flag.StringVar(&c.dlqTopic, "dlq-topic", env("KAFKA_DLQ_TOPIC", ""), "dead-letter topic (default <topic>.dlq)")
	flag.StringVar(&c.dsn, "dsn", env("DATABASE_URL", env("DEDUP_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")), "PostgreSQL connection string")
	flag.IntVar(&c.maxAttempts, "max-attempts", 5, "handler attempts before an event is dead-lettered")
	flag.BoolVar(&c.migrate, "migrate", true, "create the dedup table and schema.sql's tables if missing")
	flag.BoolVar(&c.kfake, "kfake", false, "start an in-process Kafka cluster with demo payments instead of using -brokers")
	flag.IntVar(&c.demoEvents, "demo-events", 1000, "payments produced with -kfake")
	flag.TextVar(&c.logLevel, "log-level", slog.LevelInfo, "debug, info, warn or error")
	flag.Parse()
	c.brokers = strings.Split(*brokers, ",")
	if c.dlqTopic == "" {
		c.dlqTopic = c.topic + ".dlq"
	}
	return c
}

func main() {
	cfg := parseFlags()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("worker stopped", slog.Any("error", err))
		os.Exit(1)
	}
	log.Info("worker stopped")
}

func run(ctx context.Context, cfg config, log *slog.Logger) error {
	if cfg.kfake {
		brokers, stop, err := startDemoCluster(ctx, cfg, log)
		if err != nil {
			return err
		}
		defer stop()
		cfg.brokers = brokers
	}

	pool, err := pgxpool.New(ctx, cfg.dsn)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer pool.Close()
	store, err := dedup.NewPostgresStore(pool)
	if err != nil {
		return err
	}
	if cfg.migrate {
		if err := store.Migrate(ctx); err != nil {
			return err
		}
		if _, err := pool.Exec(ctx, schema); err != nil {
			return fmt.Errorf("apply schema.sql: %w", err)
		}
	}

	// TLS and SASL go here too (kgo.DialTLSConfig, kgo.SASL), for both clients.
	producer, err := kgo.NewClient(kgo.SeedBrokers(cfg.brokers...))
	if err != nil {
		return err
	}
	defer producer.Close()
	sink, err := kafkadedup.NewSink(producer, kafkadedup.WithSpringHeaders(),
		kafkadedup.WithDLQTopic(func(string) string { return cfg.dlqTopic }))
	if err != nil {
		return err
	}

	var st stats
	w, err := dedup.WrapTx(store, kafkadedup.Messages(), applyPayment,
		dedup.WithScope(dedup.Scope(cfg.group, handlerName)),
		dedup.WithSink(sink),
		dedup.WithMaxAttempts(cfg.maxAttempts),
		dedup.WithObserver(st.observe),
		dedup.WithLogger(log),
	)
	if err != nil {
		return err
	}
	consumer, err := kafkadedup.NewConsumer(w, kafkadedup.WithLogger(log), kafkadedup.WithClientOpts(
		kgo.SeedBrokers(cfg.brokers...),
		kgo.ConsumerGroup(cfg.group),
		kgo.ConsumeTopics(cfg.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	))
	if err != nil {
		return err
	}

	go st.logEvery(ctx, log, 5*time.Second)
	log.Info("worker running", slog.Any("brokers", cfg.brokers), slog.String("group", cfg.group),
		slog.String("topic", cfg.topic), slog.String("dlq", cfg.dlqTopic))
	err = consumer.Run(ctx)
	st.log(log)
	return err
}

// payment is the event's payload.
type payment struct {
	Account string `json:"account"`
	Cents   int64  `json:"cents"`
}

// applyPayment records the payment and credits the account, inside the
// inbox's transaction: both commit with the dedup record, or neither does.
func applyPayment(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
	var p payment
	if err := json.Unmarshal(r.Value, &p); err != nil {
		return dedup.Permanent(fmt.Errorf("decode payment: %w", err))
	}
	if p.Account == "" || p.Cents <= 0 {
		return dedup.Permanent(fmt.Errorf("invalid payment: account %q, %d cents", p.Account, p.Cents))
	}
	eventID, err := kafkadedup.Messages().EventID(r)
	if err != nil {
		return dedup.Permanent(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO payments (event_id, account, cents, topic, kpartition, koffset)
		VALUES ($1, $2, $3, $4, $5, $6)`, eventID, p.Account, p.Cents, r.Topic, r.Partition, r.Offset); err != nil {
		return fmt.Errorf("insert payment: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO balances (account, cents) VALUES ($1, $2)
		ON CONFLICT (account) DO UPDATE SET cents = balances.cents + EXCLUDED.cents, updated_at = now()`,
		p.Account, p.Cents); err != nil {
		return fmt.Errorf("credit balance: %w", err)
	}
	return nil
}

// stats counts the wrapper's outcomes, for the periodic log line.
type stats struct {
	processed, duplicates, retried, deadLettered, inFlight atomic.Int64
}

func (s *stats) observe(_ context.Context, res dedup.Result) {
	switch res.Outcome {
	case dedup.OutcomeProcessed:
		s.processed.Add(1)
	case dedup.OutcomeDuplicate:
		s.duplicates.Add(1)
	case dedup.OutcomeRetry:
		s.retried.Add(1)
	case dedup.OutcomeDeadLettered, dedup.OutcomeConflict:
		s.deadLettered.Add(1)
	case dedup.OutcomeInFlight:
		s.inFlight.Add(1)
	}
}

func (s *stats) log(log *slog.Logger) {
	log.Info("progress", slog.Int64("processed", s.processed.Load()), slog.Int64("duplicates", s.duplicates.Load()),
		slog.Int64("retried", s.retried.Load()), slog.Int64("dead_lettered", s.deadLettered.Load()),
		slog.Int64("in_flight_elsewhere", s.inFlight.Load()))
}

func (s *stats) logEvery(ctx context.Context, log *slog.Logger, d time.Duration) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.log(log)
		}
	}
}
