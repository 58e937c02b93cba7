package sqsdedup

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/consumeropt"
)

// Defaults applied by [NewConsumer] when an option is not given.
const (
	// DefaultWorkers holds up to 100 messages: batches of up to 40 (see
	// [WithWorkers]), two or three of them at once, so that receiving,
	// claiming and completing overlap instead of following one another.
	DefaultWorkers         = 100
	DefaultWaitTime        = 20 * time.Second
	DefaultInFlightDelay   = 5 * time.Second
	DefaultDeleteInterval  = 100 * time.Millisecond
	DefaultShutdownTimeout = consumeropt.DefaultShutdownTimeout
)

// Opt configures a [Consumer].
type Opt interface{ apply(*config) }

type optFunc func(*config)

func (f optFunc) apply(x *config) { f(x) }

type config struct {
	consumeropt.Common
	pollers        int
	workers        int
	maxMessages    int
	waitTime       time.Duration
	visibility     time.Duration
	deleteInterval time.Duration
}

func defaultConfig() config {
	return config{
		Common:         consumeropt.Defaults(DefaultInFlightDelay),
		pollers:        1,
		workers:        DefaultWorkers,
		maxMessages:    10,
		waitTime:       DefaultWaitTime,
		deleteInterval: DefaultDeleteInterval,
	}
}

func (c *config) validate() error {
	switch {
	case c.pollers < 1:
		return fmt.Errorf("%w: WithPollers(%d): must be at least 1", dedup.ErrConfig, c.pollers)
	case c.workers < 1:
		return fmt.Errorf("%w: WithWorkers(%d): must be at least 1", dedup.ErrConfig, c.workers)
	case c.maxMessages < 1 || c.maxMessages > 10:
		return fmt.Errorf("%w: WithMaxMessages(%d): must be 1 to 10", dedup.ErrConfig, c.maxMessages)
	case c.waitTime < 0 || c.waitTime > 20*time.Second:
		return fmt.Errorf("%w: WithWaitTime(%v): must be 0 to 20s", dedup.ErrConfig, c.waitTime)
	case c.visibility < 0 || c.visibility > maxVisibility:
		return fmt.Errorf("%w: WithVisibilityTimeout(%v): must be 0 (the queue's) to 12h", dedup.ErrConfig, c.visibility)
	case c.deleteInterval <= 0:
		return fmt.Errorf("%w: WithDeleteInterval(%v): must be positive", dedup.ErrConfig, c.deleteInterval)
	}
	return c.Common.Validate("")
}

// WithPollers sets how many goroutines receive from the queue (default 1).
func WithPollers(n int) Opt { return optFunc(func(c *config) { c.pollers = n }) }

// WithWorkers sets how many messages are held and handled at once (default
// 100). A poller receives only as many messages as there are free workers,
// so no message waits unhandled while its visibility timeout runs. On a
// standard queue, the messages of a receive that comes back full are handled
// together with those of the receives made right after it, without waiting,
// while each comes back full: a batch of up to half the workers and four
// receives (40 messages by default), claimed in one store call and completed
// in one write, so that the next batch is received while one is handled.
// WithWorkers(10) handles each receive on its own, one at a time.
func WithWorkers(n int) Opt { return optFunc(func(c *config) { c.workers = n }) }

// WithMaxMessages sets the most messages one receive asks for, 1 to 10
// (default 10). A batch holds the messages of at most four receives (see
// [WithWorkers]).
func WithMaxMessages(n int) Opt { return optFunc(func(c *config) { c.maxMessages = n }) }

// WithWaitTime sets how long a receive waits for messages to arrive (long
// polling), up to 20 s (default 20 s). It is rounded down to whole seconds.
func WithWaitTime(d time.Duration) Opt { return optFunc(func(c *config) { c.waitTime = d }) }

// WithVisibilityTimeout sets the visibility timeout messages are received
// with, overriding the queue's (which Run otherwise reads with
// GetQueueAttributes). It is rounded up to whole seconds.
func WithVisibilityTimeout(d time.Duration) Opt { return optFunc(func(c *config) { c.visibility = d }) }

// WithInFlightDelay sets the longest a message whose event is being handled
// elsewhere (dedup.OutcomeInFlight) stays invisible before it is looked at again
// (default 5 s). If other receives of this consumer were being handled
// meanwhile, one of them may hold the event: the message is then looked at
// again as soon as they are settled, within d. A message still in flight is
// given back for d, or the wrapper's shorter RetryAfter, rounded up to whole
// seconds (SQS's unit); WithInFlightDelay(0) gives it back at once, visible.
func WithInFlightDelay(d time.Duration) Opt { return optFunc(func(c *config) { c.InFlightDelay = d }) }

// WithDeleteInterval sets how long a settled message may wait for others to
// fill a DeleteMessageBatch of 10 (default 100 ms).
func WithDeleteInterval(d time.Duration) Opt {
	return optFunc(func(c *config) { c.deleteInterval = d })
}

// WithShutdownTimeout sets how long Run waits, once its context is done, for
// handlers to finish before it cancels their contexts (default 30 s).
func WithShutdownTimeout(d time.Duration) Opt {
	return optFunc(func(c *config) { c.ShutdownTimeout = d })
}

// WithLogger sets the logger (default: slog.Default() as of NewConsumer).
// The Consumer logs at INFO only when it stops, at WARN what it will retry
// (a failed receive, a message not acknowledged before an outage). The
// wrapper has its own logger, dedup.WithLogger, and logs an outage of the
// store or the dead-letter sink (dedup.WithOutageThreshold).
func WithLogger(l *slog.Logger) Opt { return optFunc(func(c *config) { c.Logger = l }) }

// WithMaxOutage makes Run stop, as if its context were cancelled, and return
// an error matching [ErrOutage] once handling messages has kept failing for
// longer than d (default 0: Run never gives up), so that a supervisor can
// restart or replace the process.
func WithMaxOutage(d time.Duration) Opt { return optFunc(func(c *config) { c.MaxOutage = d }) }
