package reliability_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/kafkadedup"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// workerEnv carries a worker's configuration, as JSON, into a re-executed
// test binary; its presence makes TestMain run workerMain.
const workerEnv = "DEDUP_RELIABILITY_WORKER"

// Worker modes: where the handler's effect goes and how it is deduplicated.
const (
	// modeInbox writes the effect in the dedup record's transaction (WrapTx).
	modeInbox = "inbox"
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

// workerMain is a consumer process of a campaign: a kafkadedup.Consumer
// whose handler writes one row per effect to PostgreSQL. It runs until
// SIGTERM (a graceful stop) or SIGKILL (a crash) and returns the exit code.
func workerMain(raw string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var cfg workerConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		log.Error("worker: bad configuration", slog.Any("error", err))
		return 2
	}
	log = log.With(slog.String("worker", cfg.Name))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	fmt.Fprintln(os.Stderr, workerReady)
	if err := runWorker(ctx, cfg, log); err != nil {
		log.Error("worker failed", slog.Any("error", err))
		if errors.Is(err, errRun) {
			return exitRunError
		}
		return 1
	}
	return 0
}

// workerReady is the first line of a worker's log, written once it handles
// SIGTERM: a SIGTERM sent earlier would kill it instead of stopping it.
const workerReady = "worker ready"

// errRun marks an error returned by Consumer.Run, as opposed to one that
// kept the worker from starting.
var errRun = errors.New("consumer run")

// exitRunError is the exit code of a worker whose Consumer.Run returned an
// error: a final commit refused because the group had already fenced the
// member out. Its settled records come back to the next owner as duplicates,
// which the campaign's counts cover.
const exitRunError = 3

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
	case modeInbox:
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

// fleet runs a campaign's worker processes: re-executions of the test binary
// in worker mode, each writing its own log file under the test's temporary
// directory.
type fleet struct {
	t       *testing.T
	cfg     workerConfig
	dir     string
	procs   []*workerProc // by slot; nil while the slot is down
	kills   int
	logs    []string // one per process started
	slotLog []int    // by slot, the index in logs of its current process
}

type workerProc struct {
	cmd  *exec.Cmd
	done chan error
}

func newFleet(t *testing.T, cfg workerConfig, n int) *fleet {
	dir := testenv.Env("DEDUP_RELIABILITY_LOGS", "") // keeps the logs when set
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, cfg: cfg, dir: dir, procs: make([]*workerProc, n), slotLog: make([]int, n)}
	t.Cleanup(func() {
		for i, p := range f.procs {
			if p != nil {
				_ = p.cmd.Process.Kill()
				<-p.done
				f.procs[i] = nil
			}
		}
		if t.Failed() {
			f.dumpLogs()
		}
	})
	for i := range f.procs {
		f.start(i)
	}
	return f
}

// start starts worker slot i (again).
func (f *fleet) start(i int) {
	f.t.Helper()
	cfg := f.cfg
	cfg.Slot, cfg.Name = i+1, fmt.Sprintf("w%d#%d", i+1, len(f.logs)+1)
	raw, err := json.Marshal(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	logPath := filepath.Join(f.dir, strings.ReplaceAll(cfg.Name, "#", "-")+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		f.t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), workerEnv+"="+string(raw))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		f.t.Fatalf("start worker %s: %v", cfg.Name, err)
	}
	p := &workerProc{cmd: cmd, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	f.procs[i] = p
	f.slotLog[i] = len(f.logs)
	f.logs = append(f.logs, logPath)
}

// kill kills worker slot i with SIGKILL, as a crash would.
func (f *fleet) kill(i int) {
	p := f.procs[i]
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	f.procs[i] = nil
	f.kills++
}

// restarts returns how many workers were started again after they died.
func (f *fleet) restarts() int { return len(f.logs) - len(f.procs) }

// reap returns the slots whose worker died on its own since the last call,
// and how.
func (f *fleet) reap() map[int]error {
	dead := map[int]error{}
	for i, p := range f.procs {
		if p == nil {
			continue
		}
		select {
		case err := <-p.done:
			dead[i] = err
			f.procs[i] = nil
		default:
		}
	}
	return dead
}

// stop stops every worker gracefully (SIGTERM) and fails t if one does not
// exit cleanly within 30 s.
func (f *fleet) stop() {
	f.t.Helper()
	for i, p := range f.procs {
		if p != nil {
			f.waitReady(i)
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for i, p := range f.procs {
		if p == nil {
			continue
		}
		select {
		case err := <-p.done:
			var exit *exec.ExitError
			switch {
			case errors.As(err, &exit) && exit.ExitCode() == exitRunError:
				f.t.Logf("worker slot %d: Consumer.Run returned an error (see its log)", i+1)
			case err != nil:
				f.t.Errorf("worker slot %d exited with %v after SIGTERM", i+1, err)
			}
		case <-time.After(30 * time.Second):
			f.t.Errorf("worker slot %d did not stop within 30 s of SIGTERM", i+1)
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		f.procs[i] = nil
	}
}

// waitReady waits up to 10 s for worker slot i to handle SIGTERM.
func (f *fleet) waitReady(i int) {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if b, _ := os.ReadFile(f.logs[f.slotLog[i]]); strings.HasPrefix(string(b), workerReady) {
			return
		}
	}
}

// checkLogs fails t if any worker reported a data race or a panic.
func (f *fleet) checkLogs() {
	f.t.Helper()
	for _, path := range f.logs {
		b, err := os.ReadFile(path)
		if err != nil {
			f.t.Error(err)
			continue
		}
		for _, bad := range []string{"WARNING: DATA RACE", "panic:", "fatal error:"} {
			if strings.Contains(string(b), bad) {
				f.t.Errorf("worker log %s contains %q", filepath.Base(path), bad)
			}
		}
	}
}

// dumpLogs prints the tail of every worker's log.
func (f *fleet) dumpLogs() {
	for _, path := range f.logs {
		b, _ := os.ReadFile(path)
		var lines []string
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if !strings.Contains(l, "message dead-lettered") { // the poison events' letters: expected, many
				lines = append(lines, l)
			}
		}
		if len(lines) > 40 {
			lines = append([]string{fmt.Sprintf("... (%d lines before)", len(lines)-40)}, lines[len(lines)-40:]...)
		}
		f.t.Logf("==== %s\n%s", filepath.Base(path), strings.Join(lines, "\n"))
	}
}
