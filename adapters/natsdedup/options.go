package natsdedup

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/consumeropt"
)

// Defaults applied by [NewConsumer] when an option is not given.
const (
	// DefaultWorkers is how many messages a Consumer holds at once: four
	// batches of DefaultBatchSize, so that the store's commits of one batch
	// overlap those of the others (measured in dedupbench's nats row: 1.5 to
	// 2 times the throughput of two batches of 50).
	DefaultWorkers = 400
	// DefaultBatchSize is the most messages one batch holds: pulled
	// together, claimed in one store call and completed together.
	DefaultBatchSize = 100
	// DefaultFetchWait is how long a pull waits for a message to arrive.
	DefaultFetchWait = 5 * time.Second
	// DefaultInFlightDelay is the longest a message whose event is being
	// handled elsewhere waits before it is delivered again.
	DefaultInFlightDelay = time.Second
	// DefaultShutdownTimeout is how long Run waits for running handlers once
	// its context is done.
	DefaultShutdownTimeout = consumeropt.DefaultShutdownTimeout
	// DefaultAckTimeout bounds the wait for the server's confirmation of an
	// acknowledgement (see [WithAckTimeout]).
	DefaultAckTimeout = 10 * time.Second
)

// Opt configures a [Consumer].
type Opt interface{ apply(*config) }

type optFunc func(*config)

func (f optFunc) apply(x *config) { f(x) }

type config struct {
	consumeropt.Common
	workers    int
	batchSize  int
	fetchWait  time.Duration
	ackWait    time.Duration
	ackTimeout time.Duration
	plainAck   bool
	js         jetstream.JetStream
	dlqSubject func(origin string) string
}

func defaultConfig() config {
	return config{
		Common:     consumeropt.Defaults(DefaultInFlightDelay),
		workers:    DefaultWorkers,
		batchSize:  DefaultBatchSize,
		fetchWait:  DefaultFetchWait,
		ackTimeout: DefaultAckTimeout,
		dlqSubject: defaultDLQSubject,
	}
}

func (c *config) validate() error {
	switch {
	case c.workers < 1:
		return fmt.Errorf("%w: natsdedup: WithWorkers(%d): must be at least 1", dedup.ErrConfig, c.workers)
	case c.batchSize < 1:
		return fmt.Errorf("%w: natsdedup: WithBatchSize(%d): must be at least 1", dedup.ErrConfig, c.batchSize)
	case c.fetchWait < 100*time.Millisecond:
		return fmt.Errorf("%w: natsdedup: WithFetchWait(%v): must be at least 100ms", dedup.ErrConfig, c.fetchWait)
	case c.ackWait < 0:
		return fmt.Errorf("%w: natsdedup: WithAckWait(%v): must not be negative", dedup.ErrConfig, c.ackWait)
	case c.ackTimeout <= 0:
		return fmt.Errorf("%w: natsdedup: WithAckTimeout(%v): must be positive", dedup.ErrConfig, c.ackTimeout)
	}
	return c.Common.Validate("natsdedup: ")
}

// WithWorkers sets how many messages a Consumer holds and handles at once
// (default 400). It pulls only as many messages as there are free workers,
// so no message waits unhandled while its AckWait runs. The consumer's
// MaxAckPending also bounds it, on the server's side.
func WithWorkers(n int) Opt { return optFunc(func(c *config) { c.workers = n }) }

// WithBatchSize sets the most messages one pull asks for (default 100, and
// never more than the workers or the consumer's MaxRequestBatch): a batch's
// keys are claimed in one store call, its handlers run concurrently and its
// successes are completed together, so that the next batch is pulled and
// handled meanwhile.
func WithBatchSize(n int) Opt { return optFunc(func(c *config) { c.batchSize = n }) }

// WithFetchWait sets how long a pull waits for a message to arrive when
// none is pending (default 5 s). Run stops within about this long of its
// context ending, since a pull in progress is waited for rather than
// abandoned (the server would keep what it sends to an abandoned pull until
// its AckWait runs out).
func WithFetchWait(d time.Duration) Opt { return optFunc(func(c *config) { c.fetchWait = d }) }

// WithAckWait sets the AckWait Run assumes instead of reading it from the
// consumer's info; it must not exceed the consumer's own. It sets the
// heartbeat's pace (a third of it) and the store lease of each call
// (dedup.CallLease), unless the wrapper sets dedup.WithLease.
func WithAckWait(d time.Duration) Opt { return optFunc(func(c *config) { c.ackWait = d }) }

// WithInFlightDelay sets the longest a message whose event is being handled
// elsewhere (dedup.OutcomeInFlight) waits before it is delivered again
// (default 1 s); it is naked with that delay, or with the wrapper's shorter
// RetryAfter, and never kept by the heartbeat meanwhile.
func WithInFlightDelay(d time.Duration) Opt { return optFunc(func(c *config) { c.InFlightDelay = d }) }

// WithShutdownTimeout sets how long Run waits, once its context is done, for
// running handlers to finish before it cancels their contexts (default 30 s).
func WithShutdownTimeout(d time.Duration) Opt {
	return optFunc(func(c *config) { c.ShutdownTimeout = d })
}

// WithAckTimeout sets how long the Consumer waits for the server to confirm
// an acknowledgement (default 10 s). An acknowledgement not confirmed in
// time is logged; the message, already settled, may then come back and is
// acknowledged again as a duplicate.
func WithAckTimeout(d time.Duration) Opt { return optFunc(func(c *config) { c.ackTimeout = d }) }

// WithPlainAck acknowledges settled messages with Ack, which the server does
// not confirm, instead of DoubleAck. It saves a round trip per message; an
// acknowledgement lost on the way (a connection cut) is then noticed only
// when the message comes back, as a duplicate, after its AckWait.
func WithPlainAck() Opt { return optFunc(func(c *config) { c.plainAck = true }) }

// WithLogger sets the logger (default: slog.Default() as of NewConsumer).
// The Consumer logs at INFO only when it stops or its connection is back,
// at WARN what it will retry (a failed pull, a message not acknowledged, a
// lost connection), at ERROR a set-up that cannot work (a missing
// dead-letter stream, MaxDeliver too low). The wrapper has its own
// logger, dedup.WithLogger, and logs an outage of the store or the
// dead-letter sink (dedup.WithOutageThreshold).
func WithLogger(l *slog.Logger) Opt { return optFunc(func(c *config) { c.Logger = l }) }

// WithMaxOutage makes Run stop, as if its context were cancelled, and return
// an error matching [ErrOutage] once settling messages has kept failing for
// longer than d (default 0: Run never gives up), so that a supervisor can
// restart or replace the process.
func WithMaxOutage(d time.Duration) Opt { return optFunc(func(c *config) { c.MaxOutage = d }) }

// WithJetStream names the JetStream the jetstream.Consumer was made with,
// so that Run can watch its connection and check the dead-letter stream:
//
//   - While the connection is lost, [Consumer.Health] reports an outage and
//     the Consumer logs it (at WARN when lost, at INFO when back). The
//     Consumer listens to the connection's status changes
//     (nats.Conn.StatusChanged), leaving the connection's handlers as they
//     are.
//   - At the start of Run, and every 10 s while it fails, the Consumer
//     checks that a stream captures the dead-letter subject (see
//     [WithDeadLetterSubjects]) of each subject it reads: while none does,
//     Health reports an error matching dedup.ErrConfig naming the subjects
//     to capture, and the Consumer logs it at ERROR.
//
// Without it, a lost connection shows only as pulls that bring nothing, and
// a missing dead-letter stream as letters that fail.
func WithJetStream(js jetstream.JetStream) Opt { return optFunc(func(c *config) { c.js = js }) }

// WithDeadLetterSubjects names the dead-letter subject of an origin subject
// (a subject the consumer reads, wildcards included) as the [Sink] does,
// for the check of [WithJetStream]: by default "dlq." + origin, the Sink's
// default; give the Sink's [WithDLQSubject] function if it has one, or nil
// when letters go elsewhere (nothing is checked then).
func WithDeadLetterSubjects(f func(origin string) string) Opt {
	return optFunc(func(c *config) { c.dlqSubject = f })
}
