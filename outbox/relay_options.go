package outbox

import (
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/dedupkit/dedup"
)

// RelayOpt configures a [Relay].
type RelayOpt interface{ apply(*relayConfig) }

type relayOptFunc func(*relayConfig)

func (f relayOptFunc) apply(c *relayConfig) { f(c) }

type relayConfig struct {
	batch          int
	maxAttempts    int
	backoff        dedup.Backoff
	poll           time.Duration
	busyPoll       time.Duration
	publishTimeout time.Duration
	deleteSent     bool
	retention      time.Duration
	outage         time.Duration
	logger         *slog.Logger
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
}

func defaultRelayConfig() relayConfig {
	return relayConfig{
		batch:          500,
		maxAttempts:    10,
		backoff:        dedup.ExponentialBackoff(time.Second, 5*time.Minute),
		poll:           time.Second,
		busyPoll:       10 * time.Millisecond,
		publishTimeout: 30 * time.Second,
		retention:      24 * time.Hour,
		outage:         DefaultOutageThreshold,
	}
}

// DefaultOutageThreshold is how long a relay's passes fail, or its first one
// has not succeeded, before [Relay.Health] reports an outage, unless
// [WithOutageThreshold] says otherwise: the consumers' default.
const DefaultOutageThreshold = 30 * time.Second

func (c *relayConfig) validate() error {
	switch {
	case c.batch < 1:
		return fmt.Errorf("%w: batch size %d, want at least 1", errConfig, c.batch)
	case c.maxAttempts < 1:
		return fmt.Errorf("%w: max attempts %d, want at least 1", errConfig, c.maxAttempts)
	case c.backoff == nil:
		return fmt.Errorf("%w: nil backoff", errConfig)
	case c.poll <= 0:
		return fmt.Errorf("%w: poll interval %v, want more than 0", errConfig, c.poll)
	case c.busyPoll <= 0:
		return fmt.Errorf("%w: busy poll interval %v, want more than 0", errConfig, c.busyPoll)
	case c.publishTimeout <= 0:
		return fmt.Errorf("%w: publish timeout %v, want more than 0", errConfig, c.publishTimeout)
	case c.retention < 0:
		return fmt.Errorf("%w: retention %v, want 0 or more", errConfig, c.retention)
	case c.outage <= 0:
		return fmt.Errorf("%w: outage threshold %v, want more than 0", errConfig, c.outage)
	}
	return nil
}

// WithBatchSize sets the most events one pass takes (default 500). A pass
// takes what is due up to that, so batches grow with the backlog. A pass
// holds one advisory lock per distinct key in its batch, from PostgreSQL's
// shared lock table (max_locks_per_transaction × max_connections slots, 6,400
// by default): keep batch size × relays well below it.
func WithBatchSize(n int) RelayOpt { return relayOptFunc(func(c *relayConfig) { c.batch = n }) }

// WithMaxAttempts sets the publish attempts after which an event is failed
// (default 10).
func WithMaxAttempts(n int) RelayOpt { return relayOptFunc(func(c *relayConfig) { c.maxAttempts = n }) }

// WithBackoff sets how long a failed event waits before its next attempt
// (default dedup.ExponentialBackoff(time.Second, 5*time.Minute)). While it
// waits, later events of its key wait too.
func WithBackoff(b dedup.Backoff) RelayOpt {
	return relayOptFunc(func(c *relayConfig) { c.backoff = b })
}

// WithPollInterval sets the longest the relay waits between passes while
// no events arrive and no notification wakes it (default one second): how
// long the first event after a quiet spell may wait, and how soon
// backed-off events are retried after they are due. The relay polls adaptively:
// after a pass that published it looks again after [WithBusyPollInterval],
// and each pass that finds nothing doubles the wait, up to this.
func WithPollInterval(d time.Duration) RelayOpt {
	return relayOptFunc(func(c *relayConfig) { c.poll = d })
}

// WithBusyPollInterval sets how soon the relay looks for events again after
// a pass that published some but fewer than a batch (default 10
// milliseconds; a full batch is followed at once): the commit-to-publish
// latency while events keep arriving. It is capped by [WithPollInterval].
func WithBusyPollInterval(d time.Duration) RelayOpt {
	return relayOptFunc(func(c *relayConfig) { c.busyPoll = d })
}

// WithPublishTimeout bounds one Publish call (default 30 seconds); the rows
// of a pass stay locked that long at most.
func WithPublishTimeout(d time.Duration) RelayOpt {
	return relayOptFunc(func(c *relayConfig) { c.publishTimeout = d })
}

// WithDeleteSent deletes published rows instead of marking them sent.
func WithDeleteSent() RelayOpt { return relayOptFunc(func(c *relayConfig) { c.deleteSent = true }) }

// WithRetention sets how long sent rows are kept before the relay purges
// them (default 24 hours).
func WithRetention(d time.Duration) RelayOpt {
	return relayOptFunc(func(c *relayConfig) { c.retention = d })
}

// WithOutageThreshold sets how long the relay's passes may fail (the
// database or the broker unreachable), or its first pass not succeed, before
// [Relay.Health] reports it (default [DefaultOutageThreshold]).
func WithOutageThreshold(d time.Duration) RelayOpt {
	return relayOptFunc(func(c *relayConfig) { c.outage = d })
}

// WithLogger sets the relay's logger (default slog.Default()).
func WithLogger(l *slog.Logger) RelayOpt { return relayOptFunc(func(c *relayConfig) { c.logger = l }) }
