package sqsreliability_test

import (
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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/internal/testenv"
)

// workerEnv carries a worker's configuration, as JSON, into a re-executed
// test binary; its presence makes TestMain run workerMain.
const workerEnv = "DEDUP_SQSREL_WORKER"

// readyLine is what a worker writes to its log once SIGTERM stops it
// gracefully; before, SIGTERM kills it.
const readyLine = "worker: ready"

// exitRunError is a worker's exit code when Consumer.Run returned an error.
const exitRunError = 3

// workerConfig is what a worker process runs.
type workerConfig struct {
	Name             string // "w2#5": slot 2, fifth process started; recorded with each row
	SQSEndpoint      string
	QueueURL         string
	DLQURL           string
	DynamoDBEndpoint string
	Table            string // the DynamoDB dedup table
	DSN              string
	EffectsTable     string // PostgreSQL table of handler starts and effects
	Scope            string
	MaxAttempts      int
	Workers          int
}

var errPoison = errors.New("poison: this event can never succeed")

// workerMain is a consumer process of the crash campaign: an
// sqsdedup.Consumer over a DynamoDBStore whose handler writes its starts and
// effects to PostgreSQL. It runs until SIGTERM (a graceful stop) or SIGKILL
// (a crash) and returns the exit code.
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
	fmt.Fprintln(os.Stderr, readyLine)
	consumer, closeAll, err := newWorker(ctx, cfg, log)
	if err != nil {
		log.Error("worker: setup failed", slog.Any("error", err))
		return 1
	}
	defer closeAll()
	if err := consumer.Run(ctx); err != nil {
		log.Error("worker: Run failed", slog.Any("error", err))
		return exitRunError
	}
	return 0
}

func newWorker(ctx context.Context, cfg workerConfig, log *slog.Logger) (*sqsdedup.Consumer, func(), error) {
	pool, err := pgxpool.New(ctx, cfg.DSN)
	if err != nil {
		return nil, nil, err
	}
	store, err := dedup.NewDynamoDBStore(dynamoDBClient(cfg.DynamoDBEndpoint), dedup.WithTable(cfg.Table))
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	client := sqsClient(cfg.SQSEndpoint)
	sink, err := sqsdedup.NewSink(client, cfg.DLQURL)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	w, err := dedup.Wrap(store, sqsdedup.Messages(cfg.QueueURL), effectHandler(pool, cfg.EffectsTable, cfg.Name),
		dedup.WithScope(cfg.Scope),
		dedup.WithSink(sink),
		dedup.WithMaxAttempts(cfg.MaxAttempts),
		dedup.WithBackoff(func(int) time.Duration { return 0 }),
		dedup.WithLogger(log))
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	// The store lease is the queue's visibility timeout, read by Run.
	consumer, err := sqsdedup.NewConsumer(client, cfg.QueueURL, w,
		sqsdedup.WithWorkers(cfg.Workers),
		sqsdedup.WithWaitTime(time.Second),
		sqsdedup.WithInFlightDelay(time.Second),
		sqsdedup.WithShutdownTimeout(5*time.Second),
		sqsdedup.WithLogger(log))
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return consumer, pool.Close, nil
}

// effectHandler records a start row, works a little, then (unless the event
// is poison) records the effect row and works a little more, so that a kill
// lands before the effect, between effect and Complete, or elsewhere.
func effectHandler(pool *pgxpool.Pool, table, worker string) dedup.Handler[types.Message] {
	insert := `INSERT INTO ` + table + ` (event_id, worker, kind) VALUES ($1, $2, $3)`
	return func(ctx context.Context, m types.Message) error {
		id := eventIDOf(m)
		if _, err := pool.Exec(ctx, insert, id, worker, "start"); err != nil {
			return err
		}
		if err := pause(ctx, 20*time.Millisecond); err != nil {
			return err
		}
		if isPoison(aws.ToString(m.Body)) {
			return errPoison
		}
		if _, err := pool.Exec(ctx, insert, id, worker, "effect"); err != nil {
			return err
		}
		// The effect is applied: from here on, success is the only honest
		// answer, cancelled or not.
		time.Sleep(rand.N(10 * time.Millisecond))
		return nil
	}
}

// pause sleeps up to max, at random, or until ctx is done.
func pause(ctx context.Context, max time.Duration) error {
	t := time.NewTimer(rand.N(max))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func sqsClient(endpoint string) *sqs.Client {
	return sqs.New(sqs.Options{
		BaseEndpoint: aws.String(endpoint),
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("local", "local", ""),
	})
}

func dynamoDBClient(endpoint string) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		BaseEndpoint:                    aws.String(endpoint),
		Region:                          "us-east-1",
		Credentials:                     credentials.NewStaticCredentialsProvider("local", "local", ""),
		DisableValidateResponseChecksum: true,
	})
}

// fleet runs worker processes in slots, kills them and starts them again.
type fleet struct {
	t     *testing.T
	cfg   workerConfig
	dir   string
	procs []*workerProc // by slot; nil while the slot is down

	mu       sync.Mutex
	killed   map[string]bool // names of the processes killed
	started  int
	logs     []string // one per process started
	unwanted []string // processes that exited without being told to
}

type workerProc struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan error
	// ending is set before the process is killed or told to stop.
	ending chan struct{}
}

func newFleet(t *testing.T, cfg workerConfig, n int) *fleet {
	dir := testenv.Env("DEDUP_RELIABILITY_LOGS", "") // keeps the logs when set
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, cfg: cfg, dir: dir, procs: make([]*workerProc, n), killed: map[string]bool{}}
	t.Cleanup(func() {
		for i, p := range f.procs {
			if p != nil {
				close(p.ending)
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
	f.mu.Lock()
	f.started++
	cfg := f.cfg
	cfg.Name = fmt.Sprintf("w%d#%d", i+1, f.started)
	f.mu.Unlock()
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
	p := &workerProc{name: cfg.Name, log: logPath, cmd: cmd, done: make(chan error, 1), ending: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		select {
		case <-p.ending:
		default:
			f.mu.Lock()
			f.unwanted = append(f.unwanted, fmt.Sprintf("%s: %v", p.name, err))
			f.mu.Unlock()
		}
		p.done <- err
	}()
	f.procs[i] = p
	f.mu.Lock()
	f.logs = append(f.logs, logPath)
	f.mu.Unlock()
}

// kill kills worker slot i with SIGKILL, as a crash would.
func (f *fleet) kill(i int) {
	p := f.procs[i]
	close(p.ending)
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	f.procs[i] = nil
	f.mu.Lock()
	f.killed[p.name] = true
	f.mu.Unlock()
}

func (f *fleet) kills() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.killed)
}

func (f *fleet) wasKilled(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.killed[name]
}

// restarts returns how many workers were started after the first ones.
func (f *fleet) restarts() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.started - len(f.procs)
}

// crashed returns the processes that exited on their own.
func (f *fleet) crashed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.unwanted...)
}

// stop stops every worker gracefully (SIGTERM) and fails t if one does not
// exit cleanly within 60 s.
func (f *fleet) stop() {
	f.t.Helper()
	for _, p := range f.procs {
		if p != nil {
			p.waitReady(f.t)
			close(p.ending)
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
				f.t.Errorf("worker %s: Consumer.Run returned an error (see its log)", p.name)
			case err != nil:
				f.t.Errorf("worker %s exited with %v after SIGTERM", p.name, err)
			}
		case <-time.After(60 * time.Second):
			f.t.Errorf("worker %s did not stop within 60 s of SIGTERM", p.name)
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		f.procs[i] = nil
	}
}

// waitReady waits up to 30 s for the worker to handle SIGTERM.
func (p *workerProc) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if b, _ := os.ReadFile(p.log); strings.Contains(string(b), readyLine) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("worker %s not ready within 30 s", p.name)
}

// checkLogs fails t if any worker exited on its own or reported a data
// race or a panic.
func (f *fleet) checkLogs() {
	f.t.Helper()
	for _, c := range f.crashed() {
		f.t.Errorf("worker exited without being killed or stopped: %s", c)
	}
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

// leaseLost returns the keys that workers reported they lost the lease of
// while their handler ran (the wrapper's loud "lease lost" error).
func (f *fleet) leaseLost() map[string]bool {
	keys := map[string]bool{}
	for _, path := range f.logs {
		b, _ := os.ReadFile(path)
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.Contains(line, "dedup: lease lost") {
				continue
			}
			if _, rest, ok := strings.Cut(line, " key="); ok {
				key, _, _ := strings.Cut(rest, " ")
				if k, err := strconv.Unquote(key); err == nil {
					key = k // slog quotes a value holding quotes
				}
				keys[key] = true
			}
		}
	}
	return keys
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
		if len(lines) > 30 {
			lines = append([]string{fmt.Sprintf("... (%d lines before)", len(lines)-30)}, lines[len(lines)-30:]...)
		}
		f.t.Logf("==== %s\n%s", filepath.Base(path), strings.Join(lines, "\n"))
	}
}
