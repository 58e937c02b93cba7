package amqpdedup

import (
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/amqpconn"
	"github.com/dedupkit/dedup/internal/consumeropt"
)

// Defaults applied by [NewConsumer] when an option is not given.
const (
	// DefaultPrefetch holds up to 400 deliveries: four batches of
	// DefaultBatchSize at once, so that the store's commits of one batch
	// overlap those of the others (measured in dedupbench's amqp rows:
	// about two and a half times the throughput of two batches of 50).
	DefaultPrefetch = 400
	// DefaultBatchSize is the most deliveries one batch holds.
	DefaultBatchSize = 100
	// DefaultLinger is how long a batch waits for more deliveries while
	// others are being handled.
	DefaultLinger = 5 * time.Millisecond
	// DefaultInFlightDelay is how long a delivery whose event is being
	// handled elsewhere is held before it is returned to the queue.
	DefaultInFlightDelay = 5 * time.Second
	// DefaultShutdownTimeout is how long Run waits for running handlers
	// once its context is done.
	DefaultShutdownTimeout = consumeropt.DefaultShutdownTimeout
)

// Opt configures a [Consumer].
type Opt interface{ apply(*config) }

type optFunc func(*config)

func (f optFunc) apply(x *config) { f(x) }

type config struct {
	consumeropt.Common
	prefetch     int
	batchSize    int
	linger       time.Duration
	amqp         amqp.Config
	errorBackoff dedup.Backoff
	dlq          string
	dlqSet       bool // dlq given, "" included
}

func defaultConfig() config {
	return config{
		Common:       consumeropt.Defaults(DefaultInFlightDelay),
		prefetch:     DefaultPrefetch,
		batchSize:    DefaultBatchSize,
		linger:       DefaultLinger,
		amqp:         amqpconn.DefaultConfig(),
		errorBackoff: dedup.ExponentialBackoff(time.Second, 30*time.Second),
	}
}

func (c *config) validate() error {
	switch {
	case c.prefetch < 1 || c.prefetch > 65535:
		return fmt.Errorf("%w: WithPrefetch(%d): must be 1 to 65535", dedup.ErrConfig, c.prefetch)
	case c.batchSize < 1:
		return fmt.Errorf("%w: WithBatchSize(%d): must be at least 1", dedup.ErrConfig, c.batchSize)
	case c.linger < 0:
		return fmt.Errorf("%w: WithLinger(%v): must not be negative", dedup.ErrConfig, c.linger)
	case c.errorBackoff == nil:
		return fmt.Errorf("%w: WithErrorBackoff(nil)", dedup.ErrConfig)
	}
	return c.Common.Validate("")
}

// WithPrefetch sets the channel's QoS prefetch count: how many deliveries
// the consumer holds unacknowledged at most (default 400), hence how many
// batches (see [WithBatchSize]) it handles at once.
func WithPrefetch(n int) Opt { return optFunc(func(c *config) { c.prefetch = n }) }

// WithBatchSize sets the most deliveries one batch holds (default 100, and
// never more than the prefetch): a batch's keys are claimed in one store
// call, its handlers run concurrently and its successes are completed
// together, while the next batch forms and is handled.
func WithBatchSize(n int) Opt { return optFunc(func(c *config) { c.batchSize = n }) }

// WithLinger sets how long a batch waits, from its first delivery, for more
// deliveries to join it while other batches are being handled (default
// 5 ms); it is handed over sooner once full. A delivery that arrives while
// no batch is being handled is handled at once, alone, so that a lone
// delivery never waits: the linger only delays deliveries that would wait
// for a store call anyway, and under a backlog it lets them share one.
func WithLinger(d time.Duration) Opt { return optFunc(func(c *config) { c.linger = d }) }

// WithDialConfig sets how the consumer connects (TLS, SASL, heartbeat,
// vhost, dialer); the default has a 10 s heartbeat.
func WithDialConfig(cfg amqp.Config) Opt { return optFunc(func(c *config) { c.amqp = cfg }) }

// WithInFlightDelay sets how long a delivery whose event is being handled
// elsewhere (dedup.OutcomeInFlight) is held before it is returned to the
// queue, to be looked at again (default 5 s, or the wrapper's shorter
// RetryAfter).
func WithInFlightDelay(d time.Duration) Opt { return optFunc(func(c *config) { c.InFlightDelay = d }) }

// WithErrorBackoff sets how long a delivery that could not be settled (the
// store or the sink unreachable) is held before it is returned to the queue,
// by the number of batches in a row with such a failure (only a settled
// delivery ends the run) (default: exponential from 1 s to 30 s). Connecting
// again after a lost connection has a backoff of its own (see [Consumer]).
func WithErrorBackoff(b dedup.Backoff) Opt { return optFunc(func(c *config) { c.errorBackoff = b }) }

// WithShutdownTimeout sets how long Run waits, once its context is done, for
// handlers to finish before it cancels their contexts (default 30 s).
func WithShutdownTimeout(d time.Duration) Opt {
	return optFunc(func(c *config) { c.ShutdownTimeout = d })
}

// WithMaxOutage makes Run stop, as if its context were cancelled, and return
// an error matching [ErrOutage] once handling deliveries has kept failing
// for longer than d (default 0: Run never gives up).
func WithMaxOutage(d time.Duration) Opt { return optFunc(func(c *config) { c.MaxOutage = d }) }

// WithLogger sets the logger (default: slog.Default() as of NewConsumer).
// The Consumer logs at INFO when it stops or consumes again, at WARN what
// it will retry (a lost connection, a delivery not acknowledged), at ERROR a
// set-up that cannot work (a missing dead-letter queue, the Messages of
// another queue); the wrapper logs an outage of the store or the sink
// (dedup.WithOutageThreshold).
func WithLogger(l *slog.Logger) Opt { return optFunc(func(c *config) { c.Logger = l }) }

// WithDeadLetterQueue names the queue the [Sink] routes the Consumer's
// letters to, which Run checks exists (a passive declare, on a channel of
// its own) at each connection and every 10 s while it is missing: default
// the queue's name followed by ".dlq", the Sink's default. While it is
// missing, [Consumer.Health] reports an error matching dedup.ErrConfig
// saying what to declare, and the Consumer logs it at ERROR; deliveries are
// handled meanwhile, and a poison one is retried until the queue exists.
// "" checks nothing: for letters routed through an exchange, or a sink of
// another kind.
func WithDeadLetterQueue(name string) Opt {
	return optFunc(func(c *config) { c.dlq, c.dlqSet = name, true })
}
