package natsreliability_test

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/natsdedup"
	"github.com/dedupkit/dedup/internal/crashtest"
)

// workerEnv carries a worker's configuration, as JSON, into a re-executed
// test binary; its presence makes TestMain run workerMain.
const workerEnv = "DEDUP_NATSREL_WORKER"

// idHeader carries the event ID: not Nats-Msg-Id, whose duplicate window
// would drop the campaign's copies before any consumer saw them.
const idHeader = "event-id"

// workerConfig is what a worker process runs.
type workerConfig struct {
	Name         string // "w2#5": slot 2, fifth process started; recorded with each row
	URL          string
	Stream       string
	Durable      string
	DSN          string
	Table        string // the dedup table
	EffectsTable string
	Scope        string
	MaxAttempts  int
}

// workerMain is a consumer process of the campaign: a natsdedup.Consumer
// over the transactional inbox (dedup.WrapTx), whose handler writes its
// effect in the record's transaction. It runs until SIGTERM (a graceful
// stop) or SIGKILL (a crash) and returns the exit code.
func workerMain(raw string) int { return crashtest.ConsumerMain(raw, newConsumer) }

func newConsumer(ctx context.Context, cfg workerConfig, log *slog.Logger) (*natsdedup.Consumer, func(), error) {
	pool, starts, closePools, err := crashtest.InboxPools(ctx, cfg.DSN)
	if err != nil {
		return nil, nil, err
	}
	nc, err := nats.Connect(cfg.URL)
	if err != nil {
		closePools()
		return nil, nil, err
	}
	closeAll := func() {
		nc.Close()
		closePools()
	}
	c, err := func() (*natsdedup.Consumer, error) {
		js, err := jetstream.New(nc)
		if err != nil {
			return nil, err
		}
		cons, err := js.Consumer(ctx, cfg.Stream, cfg.Durable)
		if err != nil {
			return nil, err
		}
		store, err := dedup.NewPostgresStore(pool, dedup.WithTable(cfg.Table))
		if err != nil {
			return nil, err
		}
		sink, err := natsdedup.NewSink(js)
		if err != nil {
			return nil, err
		}
		w, err := dedup.WrapTx(store, natsdedup.Messages(natsdedup.WithIDHeader(idHeader)),
			crashtest.InboxHandler(starts, cfg.EffectsTable, cfg.Name, eventOf),
			dedup.WithScope(cfg.Scope),
			dedup.WithSink(sink),
			dedup.WithMaxAttempts(cfg.MaxAttempts),
			dedup.WithBackoff(func(int) time.Duration { return 0 }),
			dedup.WithLogger(log))
		if err != nil {
			return nil, err
		}
		return natsdedup.NewConsumer(cons, w,
			natsdedup.WithWorkers(40),
			natsdedup.WithFetchWait(time.Second),
			natsdedup.WithInFlightDelay(200*time.Millisecond),
			natsdedup.WithShutdownTimeout(5*time.Second),
			natsdedup.WithLogger(log))
	}()
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return c, closeAll, nil
}

// eventOf returns the event ID and payload of a message.
func eventOf(m jetstream.Msg) (string, []byte, error) {
	return m.Headers().Get(idHeader), m.Data(), nil
}
