package pubsubreliability_test

import (
	"context"
	"log/slog"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/pubsubdedup"
	"github.com/dedupkit/dedup/internal/crashtest"
	"github.com/dedupkit/dedup/internal/pubsubenv"
	"github.com/dedupkit/dedup/internal/wire"
)

// workerEnv carries a worker's configuration, as JSON, into a re-executed
// test binary; its presence makes TestMain run workerMain.
const workerEnv = "DEDUP_PUBSUBREL_WORKER"

// idAttribute carries the event ID: the campaign publishes an event twice,
// as two messages with two message IDs.
const idAttribute = wire.PubSubIDAttribute

// workerConfig is what a worker process runs.
type workerConfig struct {
	Name         string // "w2#5": slot 2, fifth process started; recorded with each row
	Addr         string // the pstest server's, in the test process
	Project      string
	Subscription string
	DLQTopic     string
	DSN          string
	Table        string // the dedup table
	EffectsTable string
	Scope        string
	MaxAttempts  int
}

// workerMain is a consumer process of the campaign: a pubsubdedup.Consumer
// over the transactional inbox (dedup.WrapTx), whose handler writes its
// effect in the record's transaction. It runs until SIGTERM (a graceful
// stop) or SIGKILL (a crash) and returns the exit code.
func workerMain(raw string) int { return crashtest.ConsumerMain(raw, newConsumer) }

func newConsumer(ctx context.Context, cfg workerConfig, log *slog.Logger) (*pubsubdedup.Consumer, func(), error) {
	pool, starts, closePools, err := crashtest.InboxPools(ctx, cfg.DSN)
	if err != nil {
		return nil, nil, err
	}
	client, closeClient, err := pubsubenv.Dial(ctx, cfg.Addr, cfg.Project)
	if err != nil {
		closePools()
		return nil, nil, err
	}
	var sink *pubsubdedup.Sink
	closeAll := func() {
		if sink != nil {
			sink.Stop()
		}
		closeClient()
		closePools()
	}
	c, err := func() (*pubsubdedup.Consumer, error) {
		store, err := dedup.NewPostgresStore(pool, dedup.WithTable(cfg.Table))
		if err != nil {
			return nil, err
		}
		if sink, err = pubsubdedup.NewSink(client, cfg.DLQTopic); err != nil {
			return nil, err
		}
		w, err := dedup.WrapTx(store, pubsubdedup.Messages(pubsubdedup.WithIDAttribute(idAttribute)),
			crashtest.InboxHandler(starts, cfg.EffectsTable, cfg.Name, eventOf),
			dedup.WithScope(cfg.Scope),
			dedup.WithSink(sink),
			dedup.WithMaxAttempts(cfg.MaxAttempts),
			dedup.WithBackoff(func(int) time.Duration { return 0 }),
			dedup.WithLogger(log))
		if err != nil {
			return nil, err
		}
		return pubsubdedup.NewConsumer(client, cfg.Subscription, w,
			pubsubdedup.WithWorkers(40),
			pubsubdedup.WithInFlightDelay(200*time.Millisecond),
			pubsubdedup.WithShutdownTimeout(5*time.Second),
			pubsubdedup.WithLogger(log))
	}()
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return c, closeAll, nil
}

// eventOf returns the event ID and payload of a message.
func eventOf(m *pubsub.Message) (string, []byte, error) {
	return m.Attributes[idAttribute], m.Data, nil
}
