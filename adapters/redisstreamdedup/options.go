package redisstreamdedup

import (
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/consumeropt"
)

// Defaults applied by [NewConsumer] when an option is not given.
const (
	// DefaultWorkers is how many entries a Consumer holds at once.
	DefaultWorkers = 100
	// DefaultBatchSize is the most entries one read asks for (COUNT): read
	// together, claimed in one store call and completed together.
	DefaultBatchSize = 50
	// DefaultBlock is how long a read waits for an entry to arrive (BLOCK).
	DefaultBlock = 2 * time.Second
	// DefaultClaimIdle is how long an entry stays pending and untouched
	// before another consumer takes it over (XAUTOCLAIM's min-idle-time),
	// and the store lease of each call.
	DefaultClaimIdle = 30 * time.Second
	// DefaultInFlightDelay is the longest an entry whose event is being
	// handled elsewhere waits before it is delivered again.
	DefaultInFlightDelay = time.Second
	// DefaultShutdownTimeout is how long Run waits for running handlers once
	// its context is done.
	DefaultShutdownTimeout = consumeropt.DefaultShutdownTimeout
)

// minClaimIdle is the shortest claim idle time Run accepts: the heartbeat
// touches held entries every third of it.
const minClaimIdle = time.Second

// Opt configures a [Consumer].
type Opt interface{ apply(*config) }

type optFunc func(*config)

func (f optFunc) apply(x *config) { f(x) }

type config struct {
	consumeropt.Common
	name      string
	workers   int
	batchSize int
	block     time.Duration
	claimIdle time.Duration
}

func defaultConfig() config {
	return config{
		Common:    consumeropt.Defaults(DefaultInFlightDelay),
		name:      defaultConsumerName(),
		workers:   DefaultWorkers,
		batchSize: DefaultBatchSize,
		block:     DefaultBlock,
		claimIdle: DefaultClaimIdle,
	}
}

// defaultConsumerName is the host's name followed by a random suffix: a
// consumer name of its own for each Consumer.
func defaultConsumerName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "consumer"
	}
	return host + "-" + strings.ToLower(rand.Text()[:8])
}

func (c *config) validate() error {
	switch {
	case c.name == "":
		return fmt.Errorf("%w: redisstreamdedup: WithConsumerName(\"\")", dedup.ErrConfig)
	case c.workers < 1:
		return fmt.Errorf("%w: redisstreamdedup: WithWorkers(%d): must be at least 1", dedup.ErrConfig, c.workers)
	case c.batchSize < 1:
		return fmt.Errorf("%w: redisstreamdedup: WithBatchSize(%d): must be at least 1", dedup.ErrConfig, c.batchSize)
	case c.block < 100*time.Millisecond:
		return fmt.Errorf("%w: redisstreamdedup: WithBlock(%v): must be at least 100ms", dedup.ErrConfig, c.block)
	case c.claimIdle < minClaimIdle:
		return fmt.Errorf("%w: redisstreamdedup: WithClaimIdle(%v): must be at least %v", dedup.ErrConfig, c.claimIdle, minClaimIdle)
	}
	return c.Common.Validate("redisstreamdedup: ")
}

// WithConsumerName sets the consumer's name in its group (default: the
// host's name and a random suffix). Two running Consumers must not share
// a name. A name no longer used keeps its entry in XINFO CONSUMERS until
// XGROUP DELCONSUMER removes it, which is left to the user; what it held
// is taken over by the others ([WithClaimIdle]).
func WithConsumerName(name string) Opt { return optFunc(func(c *config) { c.name = name }) }

// WithWorkers sets how many entries a Consumer holds and handles at once
// (default 100). It reads only as many entries as there are free workers.
func WithWorkers(n int) Opt { return optFunc(func(c *config) { c.workers = n }) }

// WithBatchSize sets the most entries one read asks for (default 50, and
// never more than the workers): a batch's keys are claimed in one store
// call, its handlers run concurrently and its successes are completed
// together, so that the next batch is read and handled meanwhile.
func WithBatchSize(n int) Opt { return optFunc(func(c *config) { c.batchSize = n }) }

// WithBlock sets how long a read (XREADGROUP BLOCK) waits for an entry to
// arrive when none is waiting (default 2 s). It is also the pace at which
// the pending entries are scanned for ones to take over, so an entry given
// back comes back within about this long of its delay. Run stops within
// about this long of its context ending, since a read in progress is
// waited for rather than abandoned.
func WithBlock(d time.Duration) Opt { return optFunc(func(c *config) { c.block = d }) }

// WithClaimIdle sets how long an entry stays pending, not touched by the
// consumer holding it, before another consumer takes it over with
// XAUTOCLAIM (default 30 s, at least 1 s): the time after which the entries
// of a consumer that died come back. A held entry is touched every third
// of it (a heartbeat), so a handler may take longer. It is the store lease
// of each call (dedup.CallLease) unless the wrapper sets dedup.WithLease;
// every Consumer of a group should use the same.
func WithClaimIdle(d time.Duration) Opt { return optFunc(func(c *config) { c.claimIdle = d }) }

// WithInFlightDelay sets the longest an entry whose event is being handled
// elsewhere (dedup.OutcomeInFlight) waits before it is delivered again
// (default 1 s); it is given back with that delay, or with the wrapper's
// shorter RetryAfter.
func WithInFlightDelay(d time.Duration) Opt { return optFunc(func(c *config) { c.InFlightDelay = d }) }

// WithShutdownTimeout sets how long Run waits, once its context is done, for
// running handlers to finish before it cancels their contexts (default 30 s).
func WithShutdownTimeout(d time.Duration) Opt {
	return optFunc(func(c *config) { c.ShutdownTimeout = d })
}

// WithLogger sets the logger (default: slog.Default() as of NewConsumer).
// The Consumer logs at INFO only when it stops or Redis answers again, at
// WARN what it will retry (a failed read, an entry not acknowledged, an
// entry deleted while pending). The wrapper has its own logger,
// dedup.WithLogger.
func WithLogger(l *slog.Logger) Opt { return optFunc(func(c *config) { c.Logger = l }) }

// WithMaxOutage makes Run stop, as if its context were cancelled, and return
// an error matching [ErrOutage] once settling entries has kept failing for
// longer than d (default 0: Run never gives up), so that a supervisor can
// restart or replace the process.
func WithMaxOutage(d time.Duration) Opt { return optFunc(func(c *config) { c.MaxOutage = d }) }
