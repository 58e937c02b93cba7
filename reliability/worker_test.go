package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/dedupkit/dedup/internal/crashtest"
)

// workerEnv carries a worker's configuration, as JSON, into a re-executed
// test binary; its presence makes TestMain run workerMain.
const workerEnv = "DEDUP_RELIABILITY_WORKER"

// Worker modes: where the handler's effect goes and how it is deduplicated.
const (
	// modeInbox writes the effect in the dedup record's transaction (WrapTx),
	// which a batch's events share.
	modeInbox = "inbox"
	// modeInboxPerEvent is modeInbox with a transaction per event
	// (WithTxPerEvent).
	modeInboxPerEvent = "inbox-per-event"
	// modeClaim claims in the store (Wrap), then writes the effect in its
	// own transaction, then completes the record.
	modeClaim = "claim"
)

// workerConfig is what a worker process runs.
type workerConfig struct {
	Slot         int    // the worker's place in the fleet: its static group membership
	Name         string // "w2#3": slot 2, third process started; recorded with each effect
	Mode         string
	Brokers      []string
	Group        string
	Topic        string
	DSN          string
	RecordsTable string
	EffectsTable string
	Scope        string
	MaxAttempts  int
	Lease        time.Duration
}

var errPoison = errors.New("poison: this event can never succeed")

// crasherLine is what a worker writes to its log, followed by the event ID,
// right before a crasher's handler kills it.
const crasherLine = "worker: a crasher kills this worker:"

// workerMain is a consumer process of a campaign: a kafkadedup.Consumer
// whose handler writes one row per effect to PostgreSQL. It runs until
// SIGTERM (a graceful stop) or SIGKILL (a crash) and returns the exit code.
func workerMain(raw string) int {
	return crashtest.WorkerMain(raw, func(ctx context.Context, cfg workerConfig, log *slog.Logger) int {
		if err := runWorker(ctx, cfg, log); err != nil {
			log.Error("worker failed", slog.Any("error", err))
			if errors.Is(err, errRun) {
				return crashtest.ExitRunError
			}
			return 1
		}
		return 0
	})
}

// errRun marks an error returned by Consumer.Run, as opposed to one that
// kept the worker from starting.
var errRun = errors.New("consumer run")

// A worker exits with crashtest.ExitRunError when its Consumer.Run returned
// an error: a final commit refused because the group had already fenced the
// member out. Its settled records come back to the next owner as duplicates,
// which the campaign's counts cover.

func runWorker(ctx context.Context, cfg workerConfig, log *slog.Logger) error {
	pool, err := pgxpool.New(ctx, cfg.DSN)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := dedup.NewPostgresStore(pool, dedup.WithTable(cfg.RecordsTable))
	if err != nil {
		return err
	}
	producer, err := kgo.NewClient(kgo.SeedBrokers(cfg.Brokers...), kgo.ProducerLinger(0))
	if err != nil {
		return err
	}
	defer producer.Close()
	sink, err := kafkadedup.NewSink(producer)
	if err != nil {
		return err
	}

	var outcomes [7]atomic.Int64
	opts := []dedup.Opt{
		dedup.WithScope(cfg.Scope),
		dedup.WithSink(sink),
		dedup.WithMaxAttempts(cfg.MaxAttempts),
		dedup.WithBackoff(dedup.ExponentialBackoff(10*time.Millisecond, 50*time.Millisecond)),
		dedup.WithLease(cfg.Lease),
		dedup.WithLogger(log),
		dedup.WithObserver(func(_ context.Context, res dedup.Result) { outcomes[res.Outcome].Add(1) }),
	}
	insert := `INSERT INTO ` + cfg.EffectsTable + ` (event_id, worker) VALUES ($1, $2)`
	var w *dedup.Wrapper[*kgo.Record]
	switch cfg.Mode {
	case modeInbox, modeInboxPerEvent:
		if cfg.Mode == modeInboxPerEvent {
			opts = append(opts, dedup.WithTxPerEvent())
		}
		w, err = dedup.WrapTx(store, kafkadedup.Messages(), func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
			if isPoison(r) {
				return errPoison
			}
			_, err := tx.Exec(ctx, insert, header(r, "event-id"), cfg.Name)
			return err
		}, opts...)
	case modeClaim:
		w, err = dedup.Wrap(store, kafkadedup.Messages(), func(ctx context.Context, r *kgo.Record) error {
			if isCrasher(r) { // as an out-of-memory kill would
				// Said first, unbuffered, so that the campaign can tell this
				// planned death from one nobody planned.
				fmt.Fprintln(os.Stderr, crasherLine, header(r, "event-id"))
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
			if isPoison(r) {
				return errPoison
			}
			_, err := pool.Exec(ctx, insert, header(r, "event-id"), cfg.Name)
			return err
		}, opts...)
	default:
		err = fmt.Errorf("unknown mode %q", cfg.Mode)
	}
	if err != nil {
		return err
	}
	consumer, err := kafkadedup.NewConsumer(w,
		kafkadedup.WithLogger(log),
		// Small batches: each retry of a record gives back the claims of the
		// rest of its batch and claims them again, one store write per record
		// (see RELIABILITY.md), and 2% poison means many retries.
		kafkadedup.WithMaxPollRecords(50),
		kafkadedup.WithDrainTimeout(time.Second),
		kafkadedup.WithErrorBackoff(dedup.ExponentialBackoff(50*time.Millisecond, time.Second)),
		kafkadedup.WithClientOpts(
			kgo.SeedBrokers(cfg.Brokers...),
			kgo.ConsumerGroup(cfg.Group),
			kgo.ConsumeTopics(cfg.Topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchMaxWait(100*time.Millisecond),
			kgo.AutoCommitInterval(200*time.Millisecond),
			kgo.InstanceID(fmt.Sprintf("%s-w%d", cfg.Group, cfg.Slot)),
			kgo.SessionTimeout(sessionTimeout),
			kgo.HeartbeatInterval(250*time.Millisecond),
			kgo.RebalanceTimeout(rebalanceTimeout),
			kgo.WithLogger(kgo.BasicLogger(os.Stderr, kgo.LogLevelWarn, func() string { return cfg.Name + " kgo " })),
		))
	if err != nil {
		return err
	}
	err = consumer.Run(ctx)
	var counts []string
	for o := dedup.OutcomeProcessed; o <= dedup.OutcomeConflict; o++ {
		counts = append(counts, fmt.Sprintf("%s=%d", o, outcomes[o].Load()))
	}
	log.Warn("worker stopped", slog.String("outcomes", strings.Join(counts, " ")), slog.Any("error", err))
	if err != nil {
		return fmt.Errorf("%w: %w", errRun, err)
	}
	return nil
}

// The group timing of the workers. Each worker is a static member of the
// group (KIP-345), as in a StatefulSet: a worker restarted within the
// session timeout takes its partitions back without a rebalance; one that
// stays down longer has them moved to the others.
//
// The rebalance timeout is kept well under the session timeout because
// kfake, unlike Kafka, keeps a member's session timer running while the
// member waits in JoinGroup: a rebalance outlasting the session timeout
// drops the members waiting in it, whose JoinGroup then never gets an
// answer (the client gives up after the rebalance timeout plus 10 s).
const (
	sessionTimeout   = 6 * time.Second
	rebalanceTimeout = 3 * time.Second
)
