package crashtest

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"testing"
)

// WorkerMain is a worker process's main: it decodes raw, the JSON of the
// worker's configuration, and returns run's exit code, run getting a
// context that SIGTERM ends and a logger naming the worker (the
// configuration's Name field); a configuration that does not decode exits 2.
func WorkerMain[C any](raw string, run func(ctx context.Context, cfg C, log *slog.Logger) int) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var cfg C
	var named struct{ Name string }
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		log.Error("worker: bad configuration", slog.Any("error", err))
		return 2
	}
	_ = json.Unmarshal([]byte(raw), &named) // decoded above: it cannot fail
	log = log.With(slog.String("worker", named.Name))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	Ready()
	return run(ctx, cfg, log)
}

// Consumer is an adapter's consumer as a worker runs it.
type Consumer interface {
	Run(ctx context.Context) error
}

// ConsumerMain is WorkerMain for a worker that runs the consumer setup
// returns (with a func releasing what it holds) until SIGTERM, exiting 1
// when setup fails (not when SIGTERM cut it short), ExitRunError when Run
// returns an error, and 0 otherwise.
func ConsumerMain[C any, R Consumer](raw string, setup func(ctx context.Context, cfg C, log *slog.Logger) (R, func(), error)) int {
	return WorkerMain(raw, func(ctx context.Context, cfg C, log *slog.Logger) int {
		consumer, release, err := setup(ctx, cfg, log)
		if err != nil && ctx.Err() != nil {
			return 0 // stopped (SIGTERM) while it was setting up
		}
		if err != nil {
			log.Error("worker: setup failed", slog.Any("error", err))
			return 1
		}
		defer release()
		if err := consumer.Run(ctx); err != nil {
			log.Error("worker: Run failed", slog.Any("error", err))
			return ExitRunError
		}
		return 0
	})
}

// Main is a campaign package's TestMain: it runs the test binary as a
// worker process (worker, given the configuration) when env is set, and
// as the test suite otherwise.
func Main(m *testing.M, env string, worker func(raw string) int) {
	if cfg := os.Getenv(env); cfg != "" {
		os.Exit(worker(cfg))
	}
	os.Exit(m.Run())
}
