package dedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/nilcheck"
	"github.com/dedupkit/dedup/internal/outage"
)

// Handler handles one message of a transport's native type M (*kgo.Record,
// types.Message, ...).
type Handler[M any] func(ctx context.Context, msg M) error

// Messages tells a [Wrapper] how to read a transport's message type M. The
// transport adapters provide one.
type Messages[M any] struct {
	// EventID returns the producer-assigned event ID. An error, or an ID
	// that is not a valid key, dead-letters the message with ReasonInvalidID.
	EventID func(M) (string, error)
	// Payload returns the bytes the fingerprint is computed over.
	Payload func(M) []byte
	// DeadLetter returns the original message as a dead letter: payload,
	// message key, headers and origin. The wrapper adds the rest.
	DeadLetter func(M) DeadLetter
	// Tenant optionally returns the message's tenant. When set, keys live in
	// the wrapper's scope plus the tenant, so tenants never share a record;
	// a message whose tenant is missing is dead-lettered with ReasonInvalidID.
	Tenant func(M) (string, error)
	// Attempts optionally returns the transport's own delivery count (SQS
	// ApproximateReceiveCount), counted beside the store's attempts when
	// deciding whether a failed event has had its last attempt.
	Attempts func(M) int
	// TraceCarrier optionally returns the message's headers, from which a
	// W3C trace context propagated by the producer is read: the delivery's
	// span (see [WithTracerProvider]) is then its child. It is also read for
	// dedup's dead-letter metadata (a name starting with [MetadataPrefix],
	// such as dedup-reason) when the event's record is FAILED_FINAL: a
	// message carrying it is a letter moved back by hand, dead-lettered
	// again with ReasonRedeliveredAfterFinal; without TraceCarrier, every
	// such delivery is acknowledged as a duplicate.
	TraceCarrier func(M) propagation.TextMapCarrier
}

// Outcome is what the wrapper decided for one delivery.
type Outcome = deduptype.Outcome

// The outcomes; each maps to exactly one transport action, as
// [deduptype.OutcomeProcessed] and the rest say.
const (
	OutcomeProcessed    = deduptype.OutcomeProcessed
	OutcomeDuplicate    = deduptype.OutcomeDuplicate
	OutcomeInFlight     = deduptype.OutcomeInFlight
	OutcomeRetry        = deduptype.OutcomeRetry
	OutcomeDeadLettered = deduptype.OutcomeDeadLettered
	OutcomeConflict     = deduptype.OutcomeConflict
)

// Result is the wrapper's decision for one delivery; its Settled method
// reports whether the transport may acknowledge the message.
type Result = deduptype.Result

// maxInFlightWait bounds the wait before a delivery whose key another
// worker holds is tried again. The holder is usually about to settle it, and
// a Kafka partition waits in place meanwhile: waiting for the whole lease
// would stall the partition for up to the lease on every duplicate that
// races its original.
const maxInFlightWait = time.Second

// settleTimeout bounds the store and sink writes that record an attempt's
// outcome once the caller's context is done: a handler that finished must be
// recorded, or its effect would be repeated.
const settleTimeout = 10 * time.Second

// Wrapper runs a handler at most once per event and parks poison messages.
// It is safe for concurrent use.
type Wrapper[M any] struct {
	store   Store
	msgs    Messages[M]
	handler Handler[M]
	cfg     config
	// claimer claims a delivery for an attempt of its own; runner runs a
	// HandleBatch and runAtOnce a HandleConcurrent; newCompleter gives a
	// batch its completer. All are chosen by Wrap or WrapTx and its
	// options.
	claimer      claimer[M]
	runner       func(*batch[M]) batchRunner[M]
	runAtOnce    func(*batch[M]) batchRunner[M]
	newCompleter func(*batch[M]) completer[M]
	// bc is the store's BatchCompleter, resolved once by newWrapper; nil:
	// the store has none.
	bc         deduptype.BatchCompleter
	heartbeats sync.Pool // of *heartbeat
	batches    sync.Pool // of *batch[M], for HandleBatch to reuse
	health     *outage.Tracker
	tel        *telemetry // nil: no spans, no metrics
	// detached is set for a [Front]'s attempts: their caller leaving ends
	// neither the claim's heartbeat nor the settling writes, as the work
	// runs on whether anyone waits for its answer or not.
	detached bool
}

// Wrap returns a Wrapper running h over store. WithScope and WithSink are
// required.
func Wrap[M any](store Store, msgs Messages[M], h Handler[M], opts ...Opt) (*Wrapper[M], error) {
	w, err := newConsumer(forWrap, store, msgs, opts)
	if err != nil {
		return nil, err
	}
	if h == nil {
		return nil, fmt.Errorf("%w: nil handler", ErrConfig)
	}
	w.handler = h
	w.claimer, w.runner, w.runAtOnce = storeAttempt[M]{w}, newStoreRunner[M], newStoreRunner[M]
	if w.bc != nil && w.cfg.batchWait > 0 {
		w.newCompleter = newBatchedCompleter[M]
	}
	return w, nil
}

// newWrapper returns the engine of a [WrapTx] consumer, as newConsumer
// does.
func newWrapper[M any](store Store, msgs Messages[M], opts []Opt) (*Wrapper[M], error) {
	return newConsumer(forWrapTx, store, msgs, opts)
}

// newConsumer returns the engine of a consumer, e being forWrap or
// forWrapTx: an option given that e does not honour is refused.
func newConsumer[M any](e engines, store Store, msgs Messages[M], opts []Opt) (*Wrapper[M], error) {
	cfg := configure(opts)
	if err := cfg.validate(e); err != nil {
		return nil, err
	}
	if msgs.EventID == nil || msgs.Payload == nil || msgs.DeadLetter == nil {
		return nil, fmt.Errorf("%w: Messages needs EventID, Payload and DeadLetter", ErrConfig)
	}
	return newEngine(store, msgs, cfg)
}

func configure(opts []Opt) config {
	cfg := defaultConfig()
	for _, o := range opts {
		o.apply(&cfg)
	}
	return cfg
}

// newEngine returns the engine under a Wrapper or a [Front], from a valid
// cfg: its store (timed when metered), telemetry, outage tracker and
// heartbeats.
func newEngine[M any](store Store, msgs Messages[M], cfg config) (*Wrapper[M], error) {
	if nilcheck.IsNil(store) {
		return nil, fmt.Errorf("%w: nil store", ErrConfig)
	}
	// The store's optional capability, resolved here once.
	bc, _ := store.(deduptype.BatchCompleter)
	if cfg.batchWaitSet && cfg.batchWait > 0 && bc == nil {
		return nil, fmt.Errorf("%w: WithBatchCompletion: the store (%T) cannot complete a batch in one write", ErrConfig, store)
	}
	health := outage.New(cfg.logger, cfg.outageThreshold, ErrOutage)
	tel, err := newTelemetry(&cfg, health)
	if err != nil {
		return nil, fmt.Errorf("%w: OpenTelemetry instruments: %w", ErrConfig, err)
	}
	if tel != nil && tel.storeCalls != nil {
		store, bc = timed(store, bc, tel.storeCalls)
	}
	w := &Wrapper[M]{store: store, bc: bc, msgs: msgs, cfg: cfg, tel: tel, health: health}
	w.runner, w.runAtOnce, w.newCompleter = newEachRunner[M], newEachRunner[M], newInlineCompleter[M]
	w.heartbeats.New = func() any { return &heartbeat{store: store, logger: cfg.logger} }
	return w, nil
}

// carrier returns msg's trace carrier, if the transport gives one.
func (w *Wrapper[M]) carrier(msg M) propagation.TextMapCarrier {
	if w.msgs.TraceCarrier == nil {
		return nil
	}
	return w.msgs.TraceCarrier(msg)
}

// Scope returns the scope the wrapper's keys live in (before any tenant).
func (w *Wrapper[M]) Scope() string { return w.cfg.scope }

// Scope returns the scope for one handler of one consumer,
// "consumer/handler", for [WithScope]: consumer is the consumer group, queue
// or service, handler names what the handler does. Name both explicitly and
// keep them stable: a scope that changes makes every event new again. Scope
// checks nothing; WithScope rejects an invalid result. A scope without a
// handler part (WithScope("billing")) is accepted, for a consumer that will
// only ever have one handler; two handlers consuming the same events need
// distinct scopes, or the second sees every event as a duplicate.
func Scope(consumer, handler string) string { return consumer + "/" + handler }

// TenantScope returns the scope of a tenant's keys within scope.
func TenantScope(scope, tenant string) string { return scope + "/tenant=" + tenant }

// delivery is one message on its way through the wrapper.
type delivery[M any] struct {
	msg M
	key Key
	fp  string
	// bad is set when the message cannot be processed at all.
	bad       Reason
	badErr    error
	leaseTime time.Duration

	// The attempt of an acquired claim, and what the claim said: the owner
	// token, the attempt count and the store's locator.
	att      attempt[M]
	owner    string
	attempts int
	locator  uint64
	// result is what a front end's success stores (see [Attempt]); nil
	// for a consumer's.
	result *frontResult

	span trace.Span  // nil unless the wrapper traces
	call *callConfig // what the transport said of the call; nil for Handle
}

// prepare reads what the wrapper needs of msg, and starts its span; call
// is what the transport said of it, nil for Handle.
func (w *Wrapper[M]) prepare(ctx context.Context, msg M, call *callConfig) (d delivery[M]) {
	d = delivery[M]{msg: msg, call: call, leaseTime: w.leaseFor(ctx, call.suggestedLease())}
	if w.tel != nil {
		defer func() { d.span = w.tel.start(ctx, w.carrier(msg), d.key.EventID) }()
	}
	id, err := w.msgs.EventID(msg)
	if err != nil {
		d.bad, d.badErr = ReasonInvalidID, err
		return d
	}
	d.key = Key{Scope: w.cfg.scope, EventID: id}
	if w.msgs.Tenant != nil {
		tenant, err := w.msgs.Tenant(msg)
		if err == nil && tenant == "" {
			err = errors.New("dedup: message has no tenant")
		}
		if err != nil {
			d.bad, d.badErr = ReasonInvalidID, err
			return d
		}
		d.key.Scope = TenantScope(w.cfg.scope, tenant)
	}
	if err := d.key.Validate(); err != nil {
		d.bad, d.badErr = ReasonInvalidID, err
		return d
	}
	if d.fp, err = w.cfg.fingerprint(w.msgs.Payload(msg)); err != nil {
		d.bad, d.badErr = ReasonInvalidPayload, err
	}
	return d
}

func (w *Wrapper[M]) leaseFor(ctx context.Context, suggested time.Duration) time.Duration {
	if w.cfg.lease > 0 {
		return w.cfg.lease
	}
	if suggested > 0 {
		return suggested
	}
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); left > time.Second {
			return left
		}
		return time.Second
	}
	return defaultLease
}

func (d *delivery[M]) request(ttl time.Duration) ClaimRequest {
	return ClaimRequest{Key: d.key, Fingerprint: d.fp, Lease: d.leaseTime, TTL: ttl}
}

// Handle processes one delivery and returns what the transport must do with
// it. A non-nil error means the outcome could not be made durable (store or
// sink unreachable, lease lost): the transport must not acknowledge the
// message, which will come back.
func (w *Wrapper[M]) Handle(ctx context.Context, msg M) (Result, error) {
	d := w.prepare(ctx, msg, nil)
	res, err := w.process(ctx, &d)
	if w.observe(ctx, &d, res, err) {
		w.health.Stamp()
	}
	return res, err
}

// observe reports one delivery's result to the observer, the outage tracker
// and the telemetry, ending its span. It reports whether the outcome was
// made durable; the caller stamps the tracker once per call.
func (w *Wrapper[M]) observe(ctx context.Context, d *delivery[M], res Result, err error) (durable bool) {
	durable = w.observeOutcome(ctx, err)
	if w.tel != nil {
		w.tel.end(ctx, d.span, res, err)
		d.span = nil
	}
	if err == nil && w.cfg.observer != nil {
		w.cfg.observer(ctx, res)
	}
	if err == nil && res.Outcome == OutcomeRetry && d.att != nil {
		w.warnPanicRetry(d, res)
	}
	return durable
}

// warnPanicRetry logs at WARN, with its stack, a panic that res, the
// retry of an attempt d ran (a later copy of its key in a batch ran none),
// tries again; a dead-lettered one is logged by park.
func (w *Wrapper[M]) warnPanicRetry(d *delivery[M], res Result) {
	if stack := panicStack(res.Err, maxLoggedStack); stack != "" {
		w.cfg.logger.Warn("dedup: handler panicked; will retry", slog.Any("key", d.key), w.origin(d),
			slog.Int("attempt", res.Attempts), slog.String("error", res.Err.Error()), slog.String("stack", stack))
	}
}

// process claims d's key and settles the attempt.
func (w *Wrapper[M]) process(ctx context.Context, d *delivery[M]) (Result, error) {
	if d.bad != "" {
		return w.parkBad(ctx, d)
	}
	c, att, err := w.claimer.claim(ctx, d.request(w.cfg.ttl))
	if err != nil {
		return Result{Key: d.key}, err
	}
	return w.settle(ctx, d, c, att)
}

// parkBad dead-letters a message that cannot be processed at all. Nothing is
// written to the store: an invalid ID cannot be a key.
func (w *Wrapper[M]) parkBad(ctx context.Context, d *delivery[M]) (Result, error) {
	if err := w.park(ctx, d, d.bad, d.badErr, Record{}); err != nil {
		return Result{Key: d.key}, err
	}
	return Result{Outcome: OutcomeDeadLettered, Key: d.key, Reason: d.bad, Err: d.badErr}, nil
}

// parkConflict dead-letters a message whose ID belongs to another event; the
// other event's record is left alone.
func (w *Wrapper[M]) parkConflict(ctx context.Context, d *delivery[M], rec Record) (Result, error) {
	cause := fmt.Errorf("%w: %s holds fingerprint %.12s, this delivery has %.12s",
		ErrFingerprintConflict, d.key, rec.Fingerprint, d.fp)
	if err := w.park(ctx, d, ReasonConflict, cause, Record{Attempts: rec.Attempts}); err != nil {
		return Result{Key: d.key}, err
	}
	w.cfg.logger.Warn("dedup: event ID reused with another payload", slog.Any("key", d.key), w.origin(d))
	return Result{Outcome: OutcomeConflict, Key: d.key, Attempts: rec.Attempts, Reason: ReasonConflict, Err: cause}, nil
}

func (w *Wrapper[M]) park(ctx context.Context, d *delivery[M], reason Reason, cause error, rec Record) error {
	dl := w.msgs.DeadLetter(d.msg)
	if dl.Origin.Group == "" && d.call != nil {
		dl.Origin.Group = d.call.group
	}
	now := time.Now()
	dl.Reason = reason
	dl.Error = cause.Error()
	root := rootCause(cause)
	dl.Cause = root.Error()
	dl.ErrorType = fmt.Sprintf("%T", cause)
	dl.CauseType = fmt.Sprintf("%T", root)
	dl.Attempts = rec.Attempts
	dl.EventID = d.key.EventID
	dl.Scope = orDefault(d.key.Scope, w.cfg.scope)
	dl.FirstFailure = orNow(rec.FirstFailure, now)
	dl.LastFailure = now
	dl.Stack = panicStack(cause, maxLetterStack)
	if d.span != nil {
		dl.Headers = withTraceContext(trace.ContextWithSpan(ctx, d.span), dl.Headers)
	}
	if err := w.cfg.sink.Send(ctx, dl); err != nil {
		return fmt.Errorf("dedup: dead-letter %s (%s): %w", d.key, reason, err)
	}
	attrs := []slog.Attr{slog.Any("key", d.key), slog.Any("origin", dl.Origin), slog.String("reason", string(reason)),
		slog.Int("attempts", rec.Attempts), slog.String("error", dl.Error)}
	if dl.Stack != "" {
		attrs = append(attrs, slog.String("stack", panicStack(cause, maxLoggedStack)))
	}
	w.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "dedup: message dead-lettered", attrs...)
	return nil
}

// warnNilAfterCancel reports a handler that returned nil after its context
// was cancelled. Its success is trusted, because running it again could apply
// its effect twice, but a handler that gives up on cancellation must return
// an error: nil means done.
func (w *Wrapper[M]) warnNilAfterCancel(key Key) {
	w.cfg.logger.Warn("dedup: handler returned nil after its context was cancelled; recorded as processed",
		slog.Any("key", key))
}

// clamp bounds d to [lo, hi].
func clamp(d, lo, hi time.Duration) time.Duration {
	return max(lo, min(d, hi))
}

func orNow(t, now time.Time) time.Time {
	if t.IsZero() {
		return now
	}
	return t
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// settleCtx returns the context of the writes that record an attempt's
// outcome, so that a handler that finished is recorded: for a consumer, ctx
// while it lasts (a transport cancels it once it may give the message to
// another consumer), and once it is done ctx's values without its
// cancellation, for up to bound (settleTimeout); for a front end's attempt
// (w.detached), whose caller leaving gives the work to nobody else, always
// the latter.
func (w *Wrapper[M]) settleCtx(ctx context.Context, bound time.Duration) (context.Context, context.CancelFunc) {
	if !w.detached && ctx.Err() == nil {
		return ctx, nothingToCancel
	}
	c := withBound(ctx, bound)
	return c, c.release
}

// nothingToCancel is the CancelFunc of a context returned as it was given.
// A func literal in settleCtx, a generic method, would capture its
// dictionary and cost an allocation per event.
func nothingToCancel() {}

// capturePanic, deferred by a function running a handler, turns a panic
// into a *PanicError in *err.
func capturePanic(err *error) {
	if v := recover(); v != nil {
		*err = &PanicError{Value: v, Stack: debug.Stack()}
	}
}

// The most of a panic's stack logged with the WARN that retries or
// dead-letters it, and kept in a dead letter, whose metadata travels in a
// broker's headers (DeadLetter.Stack).
const (
	maxLoggedStack = 8 << 10
	maxLetterStack = 2 << 10
)

// stackCut ends a stack cut short.
const stackCut = "\n...(cut)"

// panicStack returns the stack of the panic err holds (a *PanicError),
// from the goroutine's header and the frame that panicked, the recovery's
// own frames left out, cut at a line to at most limit bytes; "" when err
// holds none.
func panicStack(err error, limit int) string {
	var perr *PanicError
	if !errors.As(err, &perr) || len(perr.Stack) == 0 {
		return ""
	}
	s := strings.TrimSuffix(string(perr.Stack), "\n")
	// debug.Stack's own frame, capturePanic's and the runtime's panic
	// come first, after the goroutine's header line: the handler's frames
	// start after panic's (a function line, then its file line).
	if head := strings.IndexByte(s, '\n'); head >= 0 {
		if at := strings.Index(s, "\npanic("); at > head {
			if rest, ok := skipLines(s[at+1:], 2); ok {
				s = s[:head+1] + rest
			}
		}
	}
	if len(s) <= limit {
		return s
	}
	s = s[:limit-len(stackCut)]
	if nl := strings.LastIndexByte(s, '\n'); nl > 0 {
		s = s[:nl]
	}
	return s + stackCut
}

// skipLines returns s after its first n lines, and whether it had them.
func skipLines(s string, n int) (string, bool) {
	for ; n > 0; n-- {
		nl := strings.IndexByte(s, '\n')
		if nl < 0 {
			return "", false
		}
		s = s[nl+1:]
	}
	return s, true
}
