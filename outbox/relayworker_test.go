package outbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go/middleware"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/awsfault"
	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/kafkaoutbox"
	"github.com/dedupkit/dedup/outbox/sqsoutbox"
)

// relayWorkerEnv carries a relay process's configuration, as JSON, into a
// re-executed test binary; its presence makes TestMain run relayWorkerMain.
const relayWorkerEnv = "DEDUP_OUTBOX_RELAY_WORKER"

// relayWorkerConfig is what a relay process runs: one relay per outbox
// table, the Kafka one and the SQS one.
type relayWorkerConfig struct {
	Name        string
	DSN         string
	KafkaTable  string
	SQSTable    string
	Brokers     []string
	SQSEndpoint string
	// SQSFaultEvery fails SendMessageBatch calls in bursts, through
	// awsfault, at about this interval.
	SQSFaultEvery time.Duration
}

// sqsFaultLine is logged by a relay process each time it arms its SQS
// fault; the campaign counts these lines in the logs.
const sqsFaultLine = "campaign: failing the next SendMessageBatch calls"

// relayReady is the first line of a relay process's log, written once it
// handles SIGTERM: a SIGTERM sent earlier would kill it instead of stopping
// it.
const relayReady = "relay ready"

// relayWorkerMain runs until SIGTERM, or SIGKILL, and returns the exit code.
func relayWorkerMain(raw string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var cfg relayWorkerConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		log.Error("relay worker: bad configuration", slog.Any("error", err))
		return 2
	}
	log = log.With(slog.String("relay", cfg.Name))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	fmt.Fprintln(os.Stderr, relayReady)
	if err := runRelayWorker(ctx, cfg, log); err != nil {
		log.Error("relay worker failed", slog.Any("error", err))
		return 1
	}
	return 0
}

func runRelayWorker(ctx context.Context, cfg relayWorkerConfig, log *slog.Logger) error {
	pg, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		return err
	}
	producer, err := kgo.NewClient(kgo.SeedBrokers(cfg.Brokers...), kgo.ProducerLinger(0))
	if err != nil {
		return err
	}
	defer producer.Close()
	kpub, err := kafkaoutbox.NewPublisher(producer)
	if err != nil {
		return err
	}
	fault := awsfault.Fail(errors.New("injected: connection reset by peer"), "SendMessageBatch")
	client := sqs.New(sqs.Options{
		BaseEndpoint: aws.String(cfg.SQSEndpoint), Region: "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider("local", "local", ""),
		APIOptions:  []func(*middleware.Stack) error{fault.APIOption},
	})
	spub, err := sqsoutbox.NewPublisher(client)
	if err != nil {
		return err
	}
	opts := []outbox.RelayOpt{
		outbox.WithBatchSize(50),
		outbox.WithPollInterval(100 * time.Millisecond),
		outbox.WithBackoff(dedup.ExponentialBackoff(20*time.Millisecond, 200*time.Millisecond)),
		outbox.WithMaxAttempts(1000), // the campaign's faults are all transient
		outbox.WithPublishTimeout(2 * time.Second),
		outbox.WithLogger(log),
	}
	var relays []*outbox.Relay
	for _, pair := range []struct {
		table string
		pub   outbox.Publisher
	}{{cfg.KafkaTable, kpub}, {cfg.SQSTable, spub}} {
		ob, err := outbox.New(outbox.WithTable(pair.table))
		if err != nil {
			return err
		}
		r, err := outbox.NewRelay(ob, pg, pair.pub, opts...)
		if err != nil {
			return err
		}
		relays = append(relays, r)
	}

	var wg sync.WaitGroup
	if cfg.SQSFaultEvery > 0 {
		wg.Go(func() {
			for sleepCtx(ctx, time.Duration(rand.Int64N(int64(2*cfg.SQSFaultEvery)))) {
				n := 1 + rand.IntN(3)
				fault.Times(n)
				log.Warn(sqsFaultLine, slog.Int("calls", n))
			}
		})
	}
	errs := make(chan error, len(relays))
	for _, r := range relays {
		wg.Go(func() { errs <- r.Run(ctx) })
	}
	wg.Wait()
	close(errs)
	var all error
	for err := range errs {
		all = errors.Join(all, err)
	}
	return all
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// relayFleet runs relay processes, each logging to a file in dir.
type relayFleet struct {
	t     *testing.T
	cfg   relayWorkerConfig
	dir   string
	procs []*exec.Cmd
	done  []chan error
	kills int
	logs  []string // one per process started
	// slotLog is each slot's current log.
	slotLog []string
}

func newRelayFleet(t *testing.T, cfg relayWorkerConfig, n int) *relayFleet {
	f := &relayFleet{t: t, cfg: cfg, dir: t.TempDir(), procs: make([]*exec.Cmd, n), done: make([]chan error, n), slotLog: make([]string, n)}
	t.Cleanup(func() {
		for i := range f.procs {
			f.stop(i, syscall.SIGKILL)
		}
		if t.Failed() {
			for _, l := range f.logs {
				b, _ := os.ReadFile(l)
				t.Logf("--- %s\n%s", filepath.Base(l), b)
			}
		}
	})
	for i := range n {
		f.start(i)
	}
	return f
}

func (f *relayFleet) start(i int) {
	f.t.Helper()
	cfg := f.cfg
	cfg.Name = fmt.Sprintf("r%d#%d", i+1, len(f.logs)+1)
	raw, err := json.Marshal(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	logPath := filepath.Join(f.dir, fmt.Sprintf("r%d-%d.log", i+1, len(f.logs)+1))
	logFile, err := os.Create(logPath)
	if err != nil {
		f.t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), relayWorkerEnv+"="+string(raw))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		f.t.Fatalf("start relay %s: %v", cfg.Name, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	f.procs[i], f.done[i] = cmd, done
	f.logs = append(f.logs, logPath)
	f.slotLog[i] = logPath
}

// countLines counts the lines of every relay log containing s.
func (f *relayFleet) countLines(s string) int {
	var n int
	for _, l := range f.logs {
		b, _ := os.ReadFile(l)
		n += bytes.Count(b, []byte(s))
	}
	return n
}

// stop signals relay i and waits for it to exit; a SIGTERMed relay that
// does not exit within ten seconds is killed.
func (f *relayFleet) stop(i int, sig syscall.Signal) error {
	if f.procs[i] == nil {
		return nil
	}
	if sig == syscall.SIGTERM {
		log := f.slotLog[i]
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if b, _ := os.ReadFile(log); bytes.Contains(b, []byte(relayReady)) {
				break
			}
		}
	}
	_ = f.procs[i].Process.Signal(sig)
	var err error
	select {
	case err = <-f.done[i]:
	case <-time.After(10 * time.Second):
		_ = f.procs[i].Process.Kill()
		err = fmt.Errorf("relay %d ignored %v: %w", i+1, sig, <-f.done[i])
	}
	f.procs[i] = nil
	if sig == syscall.SIGKILL {
		f.kills++
		return nil
	}
	return err
}
