package redisstreamsreliability_test

import (
	"context"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/redisstreamdedup"
	"github.com/dedupkit/dedup/internal/crashtest"
)

// workerEnv carries a worker's configuration, as JSON, into a re-executed
// test binary; its presence makes TestMain run workerMain.
const workerEnv = "DEDUP_REDISREL_WORKER"

// workerConfig is what a worker process runs.
type workerConfig struct {
	Name         string // "w2#5": slot 2, fifth process started; its consumer name too
	Addr         string
	Stream       string
	Group        string
	DSN          string
	Table        string // the dedup table
	EffectsTable string
	Scope        string
	MaxAttempts  int
}

// workerMain is a consumer process of the campaign: a
// redisstreamdedup.Consumer over the transactional inbox (dedup.WrapTx),
// whose handler writes its effect in the record's transaction. It runs
// until SIGTERM (a graceful stop) or SIGKILL (a crash) and returns the exit
// code.
func workerMain(raw string) int { return crashtest.ConsumerMain(raw, newConsumer) }

func newConsumer(ctx context.Context, cfg workerConfig, log *slog.Logger) (*redisstreamdedup.Consumer, func(), error) {
	pool, starts, closePools, err := crashtest.InboxPools(ctx, cfg.DSN)
	if err != nil {
		return nil, nil, err
	}
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Addr})
	closeAll := func() {
		rdb.Close()
		closePools()
	}
	c, err := func() (*redisstreamdedup.Consumer, error) {
		store, err := dedup.NewPostgresStore(pool, dedup.WithTable(cfg.Table))
		if err != nil {
			return nil, err
		}
		sink, err := redisstreamdedup.NewSink(rdb)
		if err != nil {
			return nil, err
		}
		w, err := dedup.WrapTx(store, redisstreamdedup.Messages(),
			crashtest.InboxHandler(starts, cfg.EffectsTable, cfg.Name, eventOf),
			dedup.WithScope(cfg.Scope),
			dedup.WithSink(sink),
			dedup.WithMaxAttempts(cfg.MaxAttempts),
			dedup.WithBackoff(func(int) time.Duration { return 0 }),
			dedup.WithLogger(log))
		if err != nil {
			return nil, err
		}
		return redisstreamdedup.NewConsumer(rdb, cfg.Stream, cfg.Group, w,
			redisstreamdedup.WithConsumerName(cfg.Name),
			redisstreamdedup.WithWorkers(40),
			redisstreamdedup.WithBlock(500*time.Millisecond),
			redisstreamdedup.WithClaimIdle(crashClaimIdle),
			redisstreamdedup.WithInFlightDelay(200*time.Millisecond),
			redisstreamdedup.WithShutdownTimeout(5*time.Second),
			redisstreamdedup.WithLogger(log))
	}()
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return c, closeAll, nil
}

// eventOf returns the event ID and payload of a message.
func eventOf(m *redisstreamdedup.Message) (string, []byte, error) {
	id, _ := m.Field(redisstreamdedup.DefaultIDField)
	payload, _ := m.Field(redisstreamdedup.DefaultPayloadField)
	return id, []byte(payload), nil
}
