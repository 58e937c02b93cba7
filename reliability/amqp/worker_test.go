package amqpreliability_test

import (
	"context"
	"log/slog"
	"time"

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

// workerMain is a consumer process of the campaign: an amqpdedup.Consumer
// over the transactional inbox (dedup.WrapTx), whose handler writes its
// effect in the record's transaction. It runs until SIGTERM (a graceful
// stop) or SIGKILL (a crash) and returns the exit code.
func workerMain(raw string) int { return crashtest.ConsumerMain(raw, newConsumer) }

func newConsumer(ctx context.Context, cfg workerConfig, log *slog.Logger) (*amqpdedup.Consumer, func(), error) {
	pool, starts, closePools, err := crashtest.InboxPools(ctx, cfg.DSN)
	if err != nil {
		return nil, nil, err
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
	w, err := dedup.WrapTx(store, amqpdedup.Messages(cfg.Queue), crashtest.InboxHandler(starts, cfg.EffectsTable, cfg.Name, eventOf),
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

// eventOf returns the event ID and payload of a message.
func eventOf(d amqp.Delivery) (string, []byte, error) { return d.MessageId, d.Body, nil }
