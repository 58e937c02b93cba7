package dedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/backoff"
	"github.com/dedupkit/dedup/internal/nilcheck"
)

// Defaults applied by [Wrap] when an option is not given; the options' docs
// state them.
const (
	defaultMaxAttempts = 5
	defaultLease       = 30 * time.Second
	defaultTTL         = 7 * 24 * time.Hour
)

// defaultBatchWait is how long HandleBatch holds a success back at most to
// record it with others (WithBatchCompletion).
const defaultBatchWait = 100 * time.Millisecond

// Opt configures a [Wrapper].
type Opt interface{ apply(*config) }

type optFunc func(*config)

func (f optFunc) apply(c *config) { f(c) }

type config struct {
	scope       string
	fingerprint FingerprintFunc
	maxAttempts int
	backoff     Backoff
	lease       time.Duration
	ttl         time.Duration
	sink        Sink
	logger      *slog.Logger
	observer    func(context.Context, Result)
	// outageThreshold is how long failures last before they are reported.
	outageThreshold time.Duration
	// batchWait is how long HandleBatch defers a completion at most, to
	// write it with others; 0: one write per event (WithBatchCompletion).
	// batchWaitSet records that the user chose it.
	batchWait    time.Duration
	batchWaitSet bool
	// txPerEvent makes WrapTx's HandleBatch use one transaction per event.
	txPerEvent bool
	// tracerProvider and meterProvider are OpenTelemetry's; nil: none.
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
	// narrow notes the options given that only some engines honour
	// (narrowOpt), in order, for the others to refuse (refuseIgnored).
	narrow []narrowGiven
}

// engines is a set of the constructors an option is for.
type engines uint8

// The engines an option can be for: Wrap, WrapTx, and a front end's
// (NewFront, NewTxFront).
const (
	forWrap engines = 1 << iota
	forWrapTx
	forFront

	forConsumers = forWrap | forWrapTx
)

// String names the constructors of e, as an error refusing an option does.
func (e engines) String() string {
	var names []string
	for _, n := range [...]struct {
		e    engines
		name string
	}{{forWrap, "Wrap"}, {forWrapTx, "WrapTx"}, {forFront, "NewFront"}} {
		if e&n.e != 0 {
			names = append(names, n.name)
		}
	}
	return strings.Join(names, " and ")
}

// narrowGiven is an option given that only the engines in by honour.
type narrowGiven struct {
	name string
	by   engines
}

// narrowOpt is an option only the engines in by honour: set applies it,
// and its name is noted for the others to refuse it (refuseIgnored).
func narrowOpt(name string, by engines, set func(*config)) Opt {
	return optFunc(func(c *config) {
		set(c)
		c.narrow = append(c.narrow, narrowGiven{name, by})
	})
}

// consumerOpt is an option only a consumer (Wrap, WrapTx) honours.
func consumerOpt(name string, set func(*config)) Opt { return narrowOpt(name, forConsumers, set) }

// refuseIgnored is the one rule for an option given to a constructor that
// would ignore it: an error matching [ErrConfig] naming the options the
// engine e (one of forWrap, forWrapTx, forFront) does not honour, and who
// does; nil when it honours them all.
func (c *config) refuseIgnored(e engines, who string) error {
	var refused []string
	for _, o := range c.narrow {
		if o.by&e == 0 {
			verb := "does"
			if o.by&(o.by-1) != 0 {
				verb = "do"
			}
			refused = append(refused, fmt.Sprintf("%s (only %v %s)", o.name, o.by, verb))
		}
	}
	if len(refused) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s cannot honour %s: refused rather than ignored",
		ErrConfig, who, strings.Join(refused, ", "))
}

func defaultConfig() config {
	return config{
		fingerprint:     SHA256Fingerprint(),
		maxAttempts:     defaultMaxAttempts,
		backoff:         ExponentialBackoff(200*time.Millisecond, 30*time.Second),
		ttl:             defaultTTL,
		logger:          slog.Default(),
		outageThreshold: defaultOutageThreshold,
		batchWait:       defaultBatchWait,
	}
}

// ErrConfig is matched by every error [Wrap] returns for a bad option, and
// by a store's or an adapter's for theirs.
var ErrConfig = deduptype.ErrConfig

// validate checks the options of a consumer, e being forWrap or
// forWrapTx: a scope and a sink, none that e does not honour, and those
// of every engine.
func (c *config) validate(e engines) error {
	// The scope is checked as a key's is, and first.
	if kerr := (*KeyError)(nil); errors.As(Key{Scope: c.scope, EventID: "-"}.Validate(), &kerr) {
		return fmt.Errorf("%w: WithScope(%q): %s", ErrConfig, c.scope, kerr.Reason)
	}
	if nilcheck.IsNil(c.sink) {
		return fmt.Errorf("%w: a dead-letter sink is required (WithSink)", ErrConfig)
	}
	if err := c.refuseIgnored(e, e.String()); err != nil {
		return err
	}
	return c.validateEngine()
}

// validateFront checks the options of a [Front]: those of every engine,
// and none that only a consumer honours (a front end names its keys whole
// and their fingerprints, never dead-letters, decides itself whether to
// try again and has no batches).
func (c *config) validateFront() error {
	if err := c.refuseIgnored(forFront, "a front end's engine"); err != nil {
		return err
	}
	return c.validateEngine()
}

// validateEngine checks what every engine needs, a [Front]'s too: a front
// end names its keys whole and never dead-letters, so it needs neither
// scope nor sink.
func (c *config) validateEngine() error {
	switch {
	case c.maxAttempts < 1:
		return fmt.Errorf("%w: WithMaxAttempts(%d): must be at least 1", ErrConfig, c.maxAttempts)
	case c.lease < 0:
		return fmt.Errorf("%w: WithLease(%v): must not be negative", ErrConfig, c.lease)
	case c.batchWait < 0:
		return fmt.Errorf("%w: WithBatchCompletion(%v): must not be negative", ErrConfig, c.batchWait)
	case c.outageThreshold <= 0:
		return fmt.Errorf("%w: WithOutageThreshold(%v): must be positive", ErrConfig, c.outageThreshold)
	case c.ttl <= 0:
		return fmt.Errorf("%w: WithTTL(%v): must be positive", ErrConfig, c.ttl)
	case c.fingerprint == nil || c.backoff == nil || nilcheck.IsNil(c.logger):
		return fmt.Errorf("%w: nil fingerprint, backoff or logger", ErrConfig)
	}
	return c.refuseTTLUnder(c.leaseFloor(), c.leaseName())
}

// refuseTTLUnder returns an error matching ErrConfig when the TTL is
// shorter than lease, named by name: a record that expires while its claim
// is held lets a duplicate delivered after it run the handler again.
func (c *config) refuseTTLUnder(lease time.Duration, name string) error {
	if c.ttl < lease {
		return fmt.Errorf("%w: WithTTL(%v) is shorter than the lease (%s): a duplicate delivered after %v would run again",
			ErrConfig, c.ttl, name, c.ttl)
	}
	return nil
}

// WithScope sets the namespace event IDs are unique in, normally built by
// [Scope] from the consumer group or queue and a handler name. It is
// required. Give it explicitly: a scope that changes (say, with a refactor)
// makes every event new again.
func WithScope(scope string) Opt {
	return consumerOpt("WithScope", func(c *config) { c.scope = scope })
}

// WithFingerprint sets how a payload's business meaning is hashed; the
// default is [SHA256Fingerprint]. See [JSONFingerprint].
func WithFingerprint(f FingerprintFunc) Opt {
	return consumerOpt("WithFingerprint", func(c *config) { c.fingerprint = f })
}

// WithMaxAttempts sets how many handler attempts an event gets before it is
// dead-lettered (default 5).
func WithMaxAttempts(n int) Opt {
	return consumerOpt("WithMaxAttempts", func(c *config) { c.maxAttempts = n })
}

// WithBackoff sets the wait before a failed event's next attempt (default
// ExponentialBackoff(200ms, 30s)).
func WithBackoff(b Backoff) Opt {
	return consumerOpt("WithBackoff", func(c *config) { c.backoff = b })
}

// WithLease sets how long a claim stays exclusive between heartbeats. By
// default it is the transport's own deadline: the lease a transport adapter
// passes with [CallLease] (the SQS visibility timeout),
// else the context's remaining time when it has a deadline, else 30 s. Too short re-runs a slow but alive handler elsewhere;
// too long delays recovery after a crash.
func WithLease(d time.Duration) Opt { return optFunc(func(c *config) { c.lease = d }) }

// WithTTL sets how long records are kept (default 7 days). It must cover the
// transport's whole redelivery horizon, replays and DLQ redrives included,
// and is refused with [ErrConfig] when shorter than the lease (WithLease,
// else 30 s): a record would expire while its claim is held. A transport's
// own deadline (the SQS visibility timeout) is checked by its adapter once
// known ([Wrapper.CheckCallLease]).
func WithTTL(d time.Duration) Opt { return optFunc(func(c *config) { c.ttl = d }) }

// leaseFloor is the least TTL the options allow: the lease WithLease gives,
// else the default one. A transport's own lease ([CallLease]) is known
// only per call.
func (c *config) leaseFloor() time.Duration {
	if c.lease > 0 {
		return c.lease
	}
	return defaultLease
}

// leaseName names the lease leaseFloor returns, for an error.
func (c *config) leaseName() string {
	if c.lease > 0 {
		return fmt.Sprintf("WithLease(%v)", c.lease)
	}
	return fmt.Sprintf("%v by default", defaultLease)
}

// WithSink sets where dead letters go. It is required; the transport
// adapters provide one for their dead-letter topic or queue.
func WithSink(s Sink) Opt { return consumerOpt("WithSink", func(c *config) { c.sink = s }) }

// WithLogger sets the logger (default: [slog.Default]). The wrapper logs a
// dead letter, a lost lease or a handler that returned nil after its
// context was cancelled at WARN, an outage of the store or the sink (see
// [WithOutageThreshold]) at ERROR, and retries at DEBUG.
func WithLogger(l *slog.Logger) Opt { return optFunc(func(c *config) { c.logger = l }) }

// WithOutageThreshold sets how long deliveries must keep failing to be made
// durable (the store or the dead-letter sink unreachable) before the wrapper
// logs it at ERROR (once, then a reminder each threshold while it lasts, and
// its end at INFO), and reports it through [Wrapper.Health] and the transport
// adapters' Health; the default is 30 s. Shorter
// failures are logged at WARN by the transport adapters, once per delivery
// that was not acknowledged. It is the one threshold: the adapters read the
// wrapper's.
func WithOutageThreshold(d time.Duration) Opt {
	return optFunc(func(c *config) { c.outageThreshold = d })
}

// WithObserver sets a function called once per delivery with its result,
// for metrics. It must be quick and safe for concurrent use.
func WithObserver(f func(context.Context, Result)) Opt {
	return consumerOpt("WithObserver", func(c *config) { c.observer = f })
}

// WithBatchCompletion sets how long HandleBatch may hold a success back to
// record it together with the batch's others, in one store write, instead
// of one write per event. By default it is 100 ms on a store
// that is a [deduptype.BatchCompleter] (PostgreSQL, DynamoDB, Redis, memory); 0 makes
// one write per event. [Wrap] refuses a positive maxWait with [ErrConfig]
// when the store cannot complete a batch, and [WrapTx], which records each
// event in its handler's transaction, refuses it too. No result is given
// back before its completion is durable, so a transport never acknowledges
// early; a completion waits at most maxWait (and a third of the lease) for
// the others, plus the run of the handler in progress. Handle, which has
// one message, always completes it at once.
//
// The price is a wider crash window. With one write per event, a worker
// that dies between a handler's effect and its completion leaves one event
// to run again once its lease lapses. With batch completion it may leave
// every event whose handler returned in the last maxWait, up to a whole
// batch: their effects are applied twice. An event taken over from a worker
// that died is completed on its own, before the next one runs, so a message
// that kills its worker repeats the others' effects at most once. Where a
// repeated effect is not acceptable, use the transactional inbox ([WrapTx]),
// which has no such window, or WithBatchCompletion(0).
func WithBatchCompletion(maxWait time.Duration) Opt {
	return consumerOpt("WithBatchCompletion", func(c *config) { c.batchWait, c.batchWaitSet = maxWait, true })
}

// WithTxPerEvent makes HandleBatch of a [WrapTx] wrapper run each event in
// a transaction of its own, as Handle does, instead of sharing one
// transaction among up to 1,024 events of the batch. Use it for handlers that
// must not share a transaction (one that takes locks for long), or that must
// not run again after a later handler's failure rolled the shared
// transaction back. It is for WrapTx only: Wrap and a front end refuse it
// with [ErrConfig].
func WithTxPerEvent() Opt {
	return narrowOpt("WithTxPerEvent", forWrapTx, func(c *config) { c.txPerEvent = true })
}

// DefaultTable is the table a [PostgresStore] or a [DynamoDBStore] uses
// unless [WithTable] names another.
const DefaultTable = "dedup_records"

// StoreOpt configures a [PostgresStore] or a [DynamoDBStore].
type StoreOpt interface{ apply(*storeConfig) }

type storeOptFunc func(*storeConfig)

func (f storeOptFunc) apply(c *storeConfig) { f(c) }

type storeConfig struct {
	table string
	// txConns is the bound WithTxConns gives, when txConnsGiven.
	txConns      int
	txConnsGiven bool
}

// WithTable sets the store's table name (default [DefaultTable]). For
// PostgreSQL it may be schema-qualified ("schema.table").
func WithTable(name string) StoreOpt {
	return storeOptFunc(func(c *storeConfig) { c.table = name })
}

// storeTable returns the table opts name.
func storeTable(opts []StoreOpt) string { return storeOptions(opts).table }

// storeOptions returns the configuration opts give a store.
func storeOptions(opts []StoreOpt) storeConfig {
	cfg := storeConfig{table: DefaultTable}
	for _, o := range opts {
		o.apply(&cfg)
	}
	return cfg
}

// refusePostgresOnly returns an error matching [ErrConfig] when c holds an
// option only a [PostgresStore] honours, for who, another store's
// constructor.
func (c storeConfig) refusePostgresOnly(who string) error {
	if c.txConnsGiven {
		return fmt.Errorf("%w: %s: WithTxConns bounds a PostgresStore's pool; this store holds no connections", ErrConfig, who)
	}
	return nil
}

// Backoff returns how long to wait before attempt+1, after attempt failed.
type Backoff func(attempt int) time.Duration

// ExponentialBackoff doubles the wait from base with each attempt, up to
// max, and picks uniformly in the upper half of that so that consumers
// retrying together spread out.
func ExponentialBackoff(base, max time.Duration) Backoff {
	return backoff.Exponential(base, max)
}
