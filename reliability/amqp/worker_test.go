package amqpreliability_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/amqpdedup"
	"github.com/dedupkit/dedup/internal/crashtest"
)

// workerEnv carries a worker's configuration, as JSON, into a re-executed
// test binary; its presence makes TestMain run workerMain.
const workerEnv = "DEDUP_AMQPREL_WORKER"

// workerConfig is what a worker process runs.
type workerConfig struct {
	Name         string // "w2#5": slot 2, fifth process started; recorded with each row
	URL          string
	Queue        string
	DSN          string
	Table        string // the dedup table
	EffectsTable string
	Scope        string
	MaxAttempts  int
	Prefetch     int
}

var errPoison = errors.New("poison: this event can never succeed")

// workerMain is a consumer process of the campaign: an amqpdedup.Consumer
// over the transactional inbox (dedup.WrapTx), whose handler writes its
// effect in the record's transaction. It runs until SIGTERM (a graceful
// stop) or SIGKILL (a crash) and returns the exit code.
func workerMain(raw string) int { return crashtest.ConsumerMain(raw, newConsumer) }

func newConsumer(ctx context.Context, cfg workerConfig, log *slog.Logger) (*amqpdedup.Consumer, func(), error) {
	// The records' transactions and the start rows written beside them
	// have a pool each: a handler waiting for a connection that its own
	// batch's transactions hold would wait forever.
	pool, err := pgxpool.New(ctx, cfg.DSN)
	if err != nil {
		return nil, nil, err
	}
	starts, err := pgxpool.New(ctx, cfg.DSN)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	closePools := func() {
		starts.Close()
		pool.Close()
	}
	store, err := dedup.NewPostgresStore(pool, dedup.WithTable(cfg.Table))
	if err != nil {
		closePools()
		return nil, nil, err
	}
	sink, err := amqpdedup.NewSink(cfg.URL)
	if err != nil {
		closePools()
		return nil, nil, err
	}
	w, err := dedup.WrapTx(store, amqpdedup.Messages(cfg.Queue), effectHandler(starts, cfg.EffectsTable, cfg.Name),
		dedup.WithScope(cfg.Scope),
		dedup.WithSink(sink),
		dedup.WithMaxAttempts(cfg.MaxAttempts),
		dedup.WithBackoff(func(int) time.Duration { return 0 }),
		dedup.WithLogger(log))
	if err == nil {
		var c *amqpdedup.Consumer
		c, err = amqpdedup.NewConsumer(cfg.URL, cfg.Queue, w,
			amqpdedup.WithPrefetch(cfg.Prefetch),
			amqpdedup.WithInFlightDelay(200*time.Millisecond),
			amqpdedup.WithShutdownTimeout(5*time.Second),
			amqpdedup.WithLogger(log))
		if err == nil {
			return c, func() {
				sink.Close()
				closePools()
			}, nil
		}
	}
	sink.Close()
	closePools()
	return nil, nil, err
}

// effectHandler records a start row outside the transaction, works a
// little, then (unless the event is poison) writes the effect in the
// record's transaction and works a little more, so that a kill lands
// before the effect, between effect and commit, or elsewhere.
func effectHandler(pool *pgxpool.Pool, table, worker string) dedup.TxHandler[amqp.Delivery] {
	insert := `INSERT INTO ` + table + ` (event_id, worker, kind) VALUES ($1, $2, $3)`
	return func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		if _, err := pool.Exec(ctx, insert, d.MessageId, worker, "start"); err != nil {
			return err
		}
		if err := crashtest.Pause(ctx, 20*time.Millisecond); err != nil {
			return err
		}
		if strings.Contains(string(d.Body), `"poison":true`) {
			return errPoison
		}
		if _, err := tx.Exec(ctx, insert, d.MessageId, worker, "effect"); err != nil {
			return err
		}
		return crashtest.Pause(ctx, 10*time.Millisecond)
	}
}
