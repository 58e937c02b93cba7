package natsreliability_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

var errPoison = errors.New("poison: this event can never succeed")

// workerMain is a consumer process of the campaign: a natsdedup.Consumer
// over the transactional inbox (dedup.WrapTx), whose handler writes its
// effect in the record's transaction. It runs until SIGTERM (a graceful
// stop) or SIGKILL (a crash) and returns the exit code.
func workerMain(raw string) int { return crashtest.ConsumerMain(raw, newConsumer) }

func newConsumer(ctx context.Context, cfg workerConfig, log *slog.Logger) (*natsdedup.Consumer, func(), error) {
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
	nc, err := nats.Connect(cfg.URL)
	if err != nil {
		pool.Close()
		starts.Close()
		return nil, nil, err
	}
	closeAll := func() {
		nc.Close()
		starts.Close()
		pool.Close()
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
			effectHandler(starts, cfg.EffectsTable, cfg.Name),
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

// effectHandler records a start row outside the transaction, works a
// little, then (unless the event is poison) writes the effect in the
// record's transaction and works a little more, so that a kill lands
// before the effect, between effect and commit, or elsewhere.
func effectHandler(pool *pgxpool.Pool, table, worker string) dedup.TxHandler[jetstream.Msg] {
	insert := `INSERT INTO ` + table + ` (event_id, worker, kind) VALUES ($1, $2, $3)`
	return func(ctx context.Context, tx pgx.Tx, m jetstream.Msg) error {
		id := m.Headers().Get(idHeader)
		if _, err := pool.Exec(ctx, insert, id, worker, "start"); err != nil {
			return err
		}
		if err := crashtest.Pause(ctx, 20*time.Millisecond); err != nil {
			return err
		}
		if strings.Contains(string(m.Data()), `"poison":true`) {
			return errPoison
		}
		if _, err := tx.Exec(ctx, insert, id, worker, "effect"); err != nil {
			return err
		}
		return crashtest.Pause(ctx, 10*time.Millisecond)
	}
}
