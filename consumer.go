package dedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"
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
}

// Outcome is what the wrapper decided for one delivery.
type Outcome int

// The outcomes; each maps to exactly one transport action.
const (
	// Processed: the handler succeeded and it is recorded. Ack.
	Processed Outcome = iota + 1
	// Duplicate: the event already succeeded or was dead-lettered. Ack.
	Duplicate
	// InFlight: another worker holds the event's lease. Do not ack; deliver
	// again after Result.RetryAfter.
	InFlight
	// Retry: the handler failed and will be attempted again. Do not ack;
	// deliver again after Result.RetryAfter.
	Retry
	// DeadLettered: the message was parked in the dead-letter sink. Ack.
	DeadLettered
	// Conflict: the event ID was already used for an event with another
	// fingerprint. The handler did not run; the message was dead-lettered
	// with ReasonConflict. Ack.
	Conflict
)

var outcomeNames = [...]string{"", "processed", "duplicate", "in-flight", "retry", "dead-lettered", "conflict"}

func (o Outcome) String() string {
	if o < 0 || int(o) >= len(outcomeNames) {
		return fmt.Sprintf("Outcome(%d)", int(o))
	}
	return outcomeNames[o]
}

// Result is the wrapper's decision for one delivery.
type Result struct {
	Outcome Outcome
	Key     Key
	// Attempts is the event's attempt count as of this delivery.
	Attempts int
	// Reason is set for DeadLettered and Conflict.
	Reason Reason
	// Err is the handler's error for Retry and DeadLettered.
	Err error
	// RetryAfter is how long to wait before the next delivery, for Retry and
	// InFlight.
	RetryAfter time.Duration
}

// Settled reports whether the transport may acknowledge the message: true for
// Processed, Duplicate, DeadLettered and Conflict.
func (r Result) Settled() bool {
	switch r.Outcome {
	case Processed, Duplicate, DeadLettered, Conflict:
		return true
	}
	return false
}

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
	// inbox is set for the PostgreSQL transactional inbox (WrapTx), which
	// replaces the store claim path.
	inbox      *inbox[M]
	heartbeats sync.Pool // of *heartbeat
}

// Wrap returns a Wrapper running h over store. WithScope and WithSink are
// required.
func Wrap[M any](store Store, msgs Messages[M], h Handler[M], opts ...Opt) (*Wrapper[M], error) {
	w, err := newWrapper(store, msgs, opts)
	if err != nil {
		return nil, err
	}
	if h == nil {
		return nil, fmt.Errorf("%w: nil handler", ErrConfig)
	}
	w.handler = h
	return w, nil
}

func newWrapper[M any](store Store, msgs Messages[M], opts []Opt) (*Wrapper[M], error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o.apply(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrConfig)
	}
	if msgs.EventID == nil || msgs.Payload == nil || msgs.DeadLetter == nil {
		return nil, fmt.Errorf("%w: Messages needs EventID, Payload and DeadLetter", ErrConfig)
	}
	w := &Wrapper[M]{store: store, msgs: msgs, cfg: cfg}
	w.heartbeats.New = func() any { return &heartbeat{store: store, logger: cfg.logger} }
	return w, nil
}

// Scope returns the scope the wrapper's keys live in (before any tenant).
func (w *Wrapper[M]) Scope() string { return w.cfg.scope }

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
}

func (w *Wrapper[M]) prepare(ctx context.Context, msg M) delivery[M] {
	d := delivery[M]{msg: msg, leaseTime: w.leaseFor(ctx)}
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

func (w *Wrapper[M]) leaseFor(ctx context.Context) time.Duration {
	if w.cfg.lease > 0 {
		return w.cfg.lease
	}
	if lease, ok := ctx.Value(leaseKey{}).(time.Duration); ok && lease > 0 {
		return lease
	}
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); left > time.Second {
			return left
		}
		return time.Second
	}
	return DefaultLease
}

func (d *delivery[M]) request(ttl time.Duration) ClaimRequest {
	return ClaimRequest{Key: d.key, Fingerprint: d.fp, Lease: d.leaseTime, TTL: ttl}
}

// Handle processes one delivery and returns what the transport must do with
// it. A non-nil error means the outcome could not be made durable (store or
// sink unreachable, lease lost): the transport must not acknowledge the
// message, which will come back.
func (w *Wrapper[M]) Handle(ctx context.Context, msg M) (Result, error) {
	d := w.prepare(ctx, msg)
	return w.finish(ctx, &d)
}

func (w *Wrapper[M]) finish(ctx context.Context, d *delivery[M]) (Result, error) {
	var res Result
	var err error
	if d.bad != "" {
		res, err = w.parkBad(ctx, d)
	} else if w.inbox != nil {
		res, err = w.runInTx(ctx, d)
	} else {
		res, err = w.claimAndRun(ctx, d)
	}
	if err == nil && w.cfg.observer != nil {
		w.cfg.observer(ctx, res)
	}
	return res, err
}

// claimAndRun is the store claim path: claim, run, settle.
func (w *Wrapper[M]) claimAndRun(ctx context.Context, d *delivery[M]) (Result, error) {
	c, err := w.store.Claim(ctx, d.request(w.cfg.ttl))
	if err != nil {
		return Result{Key: d.key}, fmt.Errorf("dedup: claim %s: %w", d.key, err)
	}
	return w.settleClaim(ctx, d, c)
}

func (w *Wrapper[M]) settleClaim(ctx context.Context, d *delivery[M], c Claim) (Result, error) {
	return w.settleClaimLater(ctx, d, c, nil)
}

// settleClaimLater is settleClaim, except that when later is not nil a
// success is appended to it, for the caller to complete with others, instead
// of being completed here.
func (w *Wrapper[M]) settleClaimLater(ctx context.Context, d *delivery[M], c Claim, later *[]Completion) (Result, error) {
	res := Result{Key: d.key, Attempts: c.Record.Attempts}
	switch c.Status {
	case ClaimDuplicate, ClaimFinal:
		res.Outcome = Duplicate
		return res, nil
	case ClaimInFlight:
		res.Outcome = InFlight
		res.RetryAfter = clamp(time.Until(c.Record.LeaseUntil), 100*time.Millisecond, min(d.leaseTime, maxInFlightWait))
		return res, nil
	case ClaimConflict:
		return w.parkConflict(ctx, d, c.Record)
	case ClaimAcquired:
	default:
		return res, fmt.Errorf("dedup: claim %s: unknown claim status %v", d.key, c.Status)
	}
	owner := c.Record.Owner
	fail := func(ctx context.Context, f Failure) error {
		return w.settleHeld(ctx, d, owner, func(ctx context.Context) error { return w.store.Fail(ctx, d.key, owner, f) })
	}
	if c.Record.Attempts > w.cfg.maxAttempts {
		// The last attempt never reached a verdict (its worker died) or its
		// dead letter could not be written: park it now without running.
		// With no failure ever recorded, every attempt ended in a death, even
		// when the claim was given back since (a batch releasing it).
		reason := ReasonHandlerError
		if c.Previous == StatusProcessing || c.Record.LastError == "" {
			reason = ReasonCrashLoop
		}
		cause := errors.New(orDefault(c.Record.LastError, "attempts exhausted without a recorded error"))
		return w.parkFinal(ctx, d, c.Record, reason, cause, fail)
	}

	hctx, cancel := context.WithCancelCause(ctx)
	hb := w.heartbeats.Get().(*heartbeat)
	hb.start(hctx, cancel, d.key, owner, d.leaseTime)
	err := callHandler(hctx, w.handler, d.msg)
	hb.stop()
	w.heartbeats.Put(hb)
	cancel(nil)

	if err == nil && ctx.Err() != nil {
		w.warnNilAfterCancel(d.key)
	}
	if err == nil && later != nil {
		*later = append(*later, Completion{Key: d.key, Owner: c.Record.Owner, TTL: w.cfg.ttl})
		res.Outcome = Processed
		return res, nil
	}
	sctx, scancel := settleContext(ctx)
	defer scancel()
	if err == nil {
		err := w.settleHeld(sctx, d, owner, func(ctx context.Context) error {
			return w.store.Complete(ctx, d.key, owner, nil, w.cfg.ttl)
		})
		if err != nil {
			return res, w.settleError("complete", d.key, err)
		}
		res.Outcome = Processed
		return res, nil
	}
	res, serr := w.afterFailure(sctx, d, c.Record, err, fail)
	if serr == nil && ctx.Err() != nil {
		// Shutting down: the attempt is recorded, the caller must not ack.
		return res, err
	}
	return res, serr
}

// afterFailure decides between retry and dead letter after a failed attempt
// and records it with fail (the store's Fail, or the inbox's failure write).
func (w *Wrapper[M]) afterFailure(ctx context.Context, d *delivery[M], rec Record, herr error, fail func(context.Context, Failure) error) (Result, error) {
	attempts := rec.Attempts
	if w.msgs.Attempts != nil {
		attempts = max(attempts, w.msgs.Attempts(d.msg))
	}
	reason := ReasonHandlerError
	var perr *PanicError
	switch {
	case IsPermanent(herr):
		reason = ReasonPermanent
	case errors.As(herr, &perr):
		reason = ReasonPanic
	}
	if reason == ReasonPermanent || attempts >= w.cfg.maxAttempts {
		rec.Attempts = attempts
		return w.parkFinal(ctx, d, rec, reason, herr, fail)
	}
	if err := fail(ctx, Failure{Error: herr.Error(), TTL: w.cfg.ttl}); err != nil {
		return Result{Key: d.key}, w.settleError("record failure", d.key, err)
	}
	w.cfg.logger.Debug("dedup: attempt failed, will retry", slog.String("key", d.key.String()),
		slog.Int("attempt", attempts), slog.Any("error", herr))
	return Result{Outcome: Retry, Key: d.key, Attempts: attempts, Err: herr,
		RetryAfter: w.cfg.backoff(attempts)}, nil
}

// parkFinal writes the dead letter, then records the key as failed for good.
// The order matters: if the sink fails, the record stays retryable and the
// message comes back, so a dead letter is never lost.
func (w *Wrapper[M]) parkFinal(ctx context.Context, d *delivery[M], rec Record, reason Reason, cause error, fail func(context.Context, Failure) error) (Result, error) {
	res := Result{Outcome: DeadLettered, Key: d.key, Attempts: rec.Attempts, Reason: reason, Err: cause}
	if err := w.park(ctx, d, reason, cause, rec); err != nil {
		if ferr := fail(ctx, Failure{Error: cause.Error(), TTL: w.cfg.ttl}); ferr != nil {
			err = errors.Join(err, ferr)
		}
		return Result{Key: d.key}, err
	}
	if err := fail(ctx, Failure{Final: true, Error: cause.Error(), TTL: w.cfg.ttl}); err != nil {
		return Result{Key: d.key}, w.settleError("record dead letter", d.key, err)
	}
	return res, nil
}

// parkBad dead-letters a message that cannot be processed at all. Nothing is
// written to the store: an invalid ID cannot be a key.
func (w *Wrapper[M]) parkBad(ctx context.Context, d *delivery[M]) (Result, error) {
	if err := w.park(ctx, d, d.bad, d.badErr, Record{}); err != nil {
		return Result{Key: d.key}, err
	}
	return Result{Outcome: DeadLettered, Key: d.key, Reason: d.bad, Err: d.badErr}, nil
}

// parkConflict dead-letters a message whose ID belongs to another event; the
// other event's record is left alone.
func (w *Wrapper[M]) parkConflict(ctx context.Context, d *delivery[M], rec Record) (Result, error) {
	cause := fmt.Errorf("%w: %s holds fingerprint %.12s, this delivery has %.12s",
		ErrFingerprintConflict, d.key, rec.Fingerprint, d.fp)
	if err := w.park(ctx, d, ReasonConflict, cause, Record{Attempts: rec.Attempts}); err != nil {
		return Result{Key: d.key}, err
	}
	w.cfg.logger.Warn("dedup: event ID reused with another payload", slog.String("key", d.key.String()))
	return Result{Outcome: Conflict, Key: d.key, Attempts: rec.Attempts, Reason: ReasonConflict, Err: cause}, nil
}

func (w *Wrapper[M]) park(ctx context.Context, d *delivery[M], reason Reason, cause error, rec Record) error {
	dl := w.msgs.DeadLetter(d.msg)
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
	if err := w.cfg.sink.Send(ctx, dl); err != nil {
		return fmt.Errorf("dedup: dead-letter %s (%s): %w", d.key, reason, err)
	}
	w.cfg.logger.Warn("dedup: message dead-lettered", slog.String("key", d.key.String()),
		slog.String("reason", string(reason)), slog.Int("attempts", rec.Attempts), slog.String("error", dl.Error))
	return nil
}

func (w *Wrapper[M]) settleError(op string, key Key, err error) error {
	if errors.Is(err, ErrLeaseLost) {
		w.cfg.logger.Error("dedup: lease lost: another worker took this event over while it ran; its effect may be applied twice",
			slog.String("key", key.String()), slog.String("op", op))
	}
	return fmt.Errorf("dedup: %s %s: %w", op, key, err)
}

// warnNilAfterCancel reports a handler that returned nil after its context
// was cancelled. Its success is trusted, because running it again could apply
// its effect twice, but a handler that gives up on cancellation must return
// an error: nil means done.
func (w *Wrapper[M]) warnNilAfterCancel(key Key) {
	w.cfg.logger.Warn("dedup: handler returned nil after its context was cancelled; recorded as processed",
		slog.String("key", key.String()))
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

// settleContext returns ctx, or when ctx is already done a detached context
// with a timeout, so that an attempt's outcome is still recorded.
func settleContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Err() == nil {
		return ctx, func() {}
	}
	return context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
}

// callHandler runs h, turning a panic into a *PanicError.
func callHandler[M any](ctx context.Context, h Handler[M], msg M) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return h(ctx, msg)
}
