package pubsubdedup

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/consumeropt"
)

// Defaults applied by [NewConsumer] when an option is not given.
const (
	// DefaultWorkers is how many messages a Consumer holds at once (the
	// client's MaxOutstandingMessages).
	DefaultWorkers = 100
	// DefaultMaxExtension is the longest the client keeps extending the
	// ack deadline of a held message (the client's own default).
	DefaultMaxExtension = 60 * time.Minute
	// DefaultInFlightDelay is the longest a message whose event is being
	// handled elsewhere is held before it is nacked.
	DefaultInFlightDelay = time.Second
	// DefaultShutdownTimeout is how long Run waits for running handlers once
	// its context is done.
	DefaultShutdownTimeout = consumeropt.DefaultShutdownTimeout
)

// The bounds Pub/Sub puts on an ack deadline and on one extension of it.
const (
	minAckDeadline = 10 * time.Second
	maxAckDeadline = 600 * time.Second
)

// Opt configures a [Consumer].
type Opt interface{ apply(*config) }

type optFunc func(*config)

func (f optFunc) apply(x *config) { f(x) }

type config struct {
	consumeropt.Common
	workers      int
	maxExtension time.Duration
	ackDeadline  time.Duration
}

func defaultConfig() config {
	return config{
		Common:       consumeropt.Defaults(DefaultInFlightDelay),
		workers:      DefaultWorkers,
		maxExtension: DefaultMaxExtension,
	}
}

func (c *config) validate() error {
	switch {
	case c.workers < 1:
		return fmt.Errorf("%w: pubsubdedup: WithWorkers(%d): must be at least 1", dedup.ErrConfig, c.workers)
	case c.maxExtension <= 0:
		return fmt.Errorf("%w: pubsubdedup: WithMaxExtension(%v): must be positive", dedup.ErrConfig, c.maxExtension)
	case c.ackDeadline != 0 && (c.ackDeadline < minAckDeadline || c.ackDeadline > maxAckDeadline):
		return fmt.Errorf("%w: pubsubdedup: WithAckDeadline(%v): must be between %v and %v", dedup.ErrConfig,
			c.ackDeadline, minAckDeadline, maxAckDeadline)
	}
	return c.Common.Validate("pubsubdedup: ")
}

// WithWorkers sets how many messages a Consumer holds and handles at once
// (default 100): the client's ReceiveSettings.MaxOutstandingMessages, so
// that no message waits unhandled while its ack deadline is extended.
func WithWorkers(n int) Opt { return optFunc(func(c *config) { c.workers = n }) }

// WithMaxExtension sets the longest the client keeps extending the ack
// deadline of a message a handler holds (default 60 min, the client's
// ReceiveSettings.MaxExtension): a handler running longer may see its
// message delivered again, answered as in flight while its store lease
// lives.
func WithMaxExtension(d time.Duration) Opt { return optFunc(func(c *config) { c.maxExtension = d }) }

// WithAckDeadline sets the deadline Run works with instead of the
// subscription's ack deadline (10 s to 600 s): each extension the client
// sends while a message is held sets its deadline this far ahead
// (ReceiveSettings.MinDurationPerAckExtension and
// MaxDurationPerAckExtension), so that the message of a crashed worker
// comes back within about it; it is also the store lease of each call
// (dedup.CallLease) unless the wrapper sets dedup.WithLease.
func WithAckDeadline(d time.Duration) Opt { return optFunc(func(c *config) { c.ackDeadline = d }) }

// WithInFlightDelay sets the longest a message whose event is being handled
// elsewhere (dedup.OutcomeInFlight) is held before it is nacked (default
// 1 s); it is held for that delay, or for the wrapper's shorter RetryAfter.
func WithInFlightDelay(d time.Duration) Opt { return optFunc(func(c *config) { c.InFlightDelay = d }) }

// WithShutdownTimeout sets how long Run waits, once its context is done, for
// running handlers to finish before it cancels their contexts (default 30 s).
func WithShutdownTimeout(d time.Duration) Opt {
	return optFunc(func(c *config) { c.ShutdownTimeout = d })
}

// WithLogger sets the logger (default: slog.Default() as of NewConsumer).
// The Consumer logs at INFO when it stops, at WARN what it will retry (a
// message not settled), at ERROR a receive that failed for good. The
// wrapper has its own logger, dedup.WithLogger.
func WithLogger(l *slog.Logger) Opt { return optFunc(func(c *config) { c.Logger = l }) }

// WithMaxOutage makes Run stop, as if its context were cancelled, and return
// an error matching [ErrOutage] once settling messages has kept failing for
// longer than d (default 0: Run never gives up), so that a supervisor can
// restart or replace the process.
func WithMaxOutage(d time.Duration) Opt { return optFunc(func(c *config) { c.MaxOutage = d }) }
