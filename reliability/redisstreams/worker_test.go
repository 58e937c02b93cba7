package redisstreamsreliability_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

var errPoison = errors.New("poison: this event can never succeed")

// workerMain is a consumer process of the campaign: a
// redisstreamdedup.Consumer over the transactional inbox (dedup.WrapTx),
// whose handler writes its effect in the record's transaction. It runs
// until SIGTERM (a graceful stop) or SIGKILL (a crash) and returns the exit
// code.
func workerMain(raw string) int { return crashtest.ConsumerMain(raw, newConsumer) }

func newConsumer(ctx context.Context, cfg workerConfig, log *slog.Logger) (*redisstreamdedup.Consumer, func(), error) {
	// The records' transactions and the start rows written beside them
	// have a pool each (see dedup.WrapTx).
	pool, err := pgxpool.New(ctx, cfg.DSN)
	if err != nil {
		return nil, nil, err
	}
	starts, err := pgxpool.New(ctx, cfg.DSN)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Addr})
	closeAll := func() {
		rdb.Close()
		starts.Close()
		pool.Close()
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
			effectHandler(starts, cfg.EffectsTable, cfg.Name),
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

// effectHandler records a start row outside the transaction, works a
// little, then (unless the event is poison) writes the effect in the
// record's transaction and works a little more, so that a kill lands
// before the effect, between effect and commit, or elsewhere.
func effectHandler(pool *pgxpool.Pool, table, worker string) dedup.TxHandler[*redisstreamdedup.Message] {
	insert := `INSERT INTO ` + table + ` (event_id, worker, kind) VALUES ($1, $2, $3)`
	return func(ctx context.Context, tx pgx.Tx, m *redisstreamdedup.Message) error {
		id, _ := m.Field(redisstreamdedup.DefaultIDField)
		payload, _ := m.Field(redisstreamdedup.DefaultPayloadField)
		if _, err := pool.Exec(ctx, insert, id, worker, "start"); err != nil {
			return err
		}
		if err := crashtest.Pause(ctx, 20*time.Millisecond); err != nil {
			return err
		}
		if strings.Contains(payload, `"poison":true`) {
			return errPoison
		}
		if _, err := tx.Exec(ctx, insert, id, worker, "effect"); err != nil {
			return err
		}
		return crashtest.Pause(ctx, 10*time.Millisecond)
	}
}
