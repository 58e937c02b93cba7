package dedup

import (
	"context"
	"fmt"
)

// Front runs the attempts of a front end that answers its own caller, such
// as idemhttp's middleware. It claims the keys the front end names and
// hands each acquired claim over as an [Attempt], held and settled by the
// rules a [Wrapper] holds its own by: the same attempts, heartbeat, fenced
// settling writes tried again after a failure, and outage tracker. The
// front end decides what each outcome is and answers it; it answers a
// claim that was not acquired itself (a duplicate replays its
// Record.Result), and never dead-letters.
//
// A front end's attempts outlive their caller: the caller leaving (its
// context cancelled) ends neither the claim's heartbeat nor the settling
// writes, as the work goes on whether anyone waits for its answer or not.
type Front[M any] struct{ w *Wrapper[M] }

// NewFront returns a Front whose attempts claim keys from store with a
// lease, and run h while the lease is extended. Of the options, WithLease,
// WithTTL, WithLogger, WithOutageThreshold and the OpenTelemetry providers
// apply: a front end names its keys whole and their fingerprints (no
// WithScope, WithFingerprint), never dead-letters (no WithSink), decides
// itself whether to try again (no WithMaxAttempts, WithBackoff) and has no
// deliveries or batches (no WithObserver, WithBatchCompletion,
// WithTxPerEvent). Any of those is an error matching [ErrConfig] that
// names it.
func NewFront[M any](store Store, h Handler[M], opts ...Opt) (*Front[M], error) {
	if h == nil {
		return nil, fmt.Errorf("%w: nil handler", ErrConfig)
	}
	f, err := newFront[M](store, opts)
	if err != nil {
		return nil, err
	}
	f.w.handler, f.w.claimer = h, storeAttempt[M]{f.w}
	return f, nil
}

func newFront[M any](store Store, opts []Opt) (*Front[M], error) {
	cfg := configure(opts)
	if err := cfg.validateFront(); err != nil {
		return nil, err
	}
	w, err := newEngine(store, Messages[M]{}, cfg)
	if err != nil {
		return nil, err
	}
	w.detached = true
	return &Front[M]{w: w}, nil
}

// Claim claims key for a request of the given fingerprint. Only an
// acquired claim comes with an Attempt, which holds it and which the
// caller must End; the others (ClaimDuplicate, ClaimInFlight,
// ClaimConflict, ClaimFinal) are the caller's to answer.
func (f *Front[M]) Claim(ctx context.Context, key Key, fingerprint string) (Claim, *Attempt[M], error) {
	w := f.w
	d := delivery[M]{key: key, fp: fingerprint, leaseTime: w.leaseFor(ctx, 0)}
	c, att, err := w.claimer.claim(ctx, d.request(w.cfg.ttl)) // d stays on the stack unless acquired
	if err != nil {
		w.observeOutcome(ctx, err)
		return c, nil, err
	}
	switch acquired, err := claimAcquired(key, c); {
	case err != nil:
		if att != nil {
			d.att = att
			(&Attempt[M]{w: w, d: d}).End(ctx) // a copy: d stays on the stack
		}
		return c, nil, err
	case acquired:
		d.att, d.owner, d.attempts, d.locator = att, c.Record.Owner, c.Record.Attempts, c.Locator
		return c, &Attempt[M]{w: w, d: d}, nil
	}
	w.health.Success()
	return c, nil, nil
}

// Health returns nil, or an error matching [ErrOutage] while the front's
// claims and settling writes have kept failing for WithOutageThreshold or
// longer, as [Wrapper.Health] does for a consumer.
func (f *Front[M]) Health() error { return f.w.Health() }

// Attempt is an acquired claim of a [Front] on its way to an outcome: Run
// runs the work while the claim is held, then one of Complete, Refuse and
// Fail records its outcome, and End, deferred after the claim, lets go of
// what the attempt still holds. An Attempt is used by one goroutine, once.
type Attempt[M any] struct {
	w      *Wrapper[M]
	d      delivery[M]
	result frontResult
	bound  boundedContext // the context of complete's write
}

// frontResult is what a front end's success stores: data, and whether it
// stands without the attempt's effects when they cannot commit (a refusal,
// see [Attempt.Refuse]). A delivery points to its attempt's, so that a
// consumer's delivery carries one word for it.
type frontResult struct {
	data       []byte
	standalone bool
}

// bytes returns r's data; nil for none.
func (r *frontResult) bytes() []byte {
	if r == nil {
		return nil
	}
	return r.data
}

// Run runs the Front's handler on msg while the claim is held: a store
// claim's lease is extended every third of its length until the handler
// returns, and the handler's context (ctx's child) is cancelled with a
// cause matching ErrLeaseLost if another worker takes the key over. It
// returns the handler's error, or its panic as a *PanicError.
func (a *Attempt[M]) Run(ctx context.Context, msg M) error {
	a.d.msg = msg
	return a.w.run(ctx, &a.d)
}

// Complete records the attempt as succeeded with result, which a later
// claim of the key finds in its Record.Result, and commits the effects of
// a transactional attempt (NewTxFront) with it. The write is fenced on the
// claim and tried again after a failure for up to ten leases, ctx's
// cancellation aside. An error matching ErrLeaseLost says that another
// worker took the key over; one matching [ErrTxAborted], that a statement
// that failed aborted the attempt's transaction: nothing was applied or
// recorded.
func (a *Attempt[M]) Complete(ctx context.Context, result []byte) error {
	return a.complete(ctx, result, false)
}

// Refuse records result as the attempt's final answer, a refusal that
// stands without the attempt's effects: as Complete, except that a
// transactional attempt whose transaction a failed statement aborted has
// its effects rolled back to the claim and result recorded alone.
func (a *Attempt[M]) Refuse(ctx context.Context, result []byte) error {
	return a.complete(ctx, result, true)
}

func (a *Attempt[M]) complete(ctx context.Context, result []byte, standalone bool) error {
	a.result = frontResult{data: result, standalone: standalone}
	a.d.result = &a.result
	sctx := &a.bound
	if sctx.Context != nil { // a second completion: the first one's context may still be held
		sctx = new(boundedContext)
	}
	sctx.bind(ctx, outcomeLeases*a.d.leaseTime) // a front end's attempt is detached: see settleCtx
	defer sctx.release()
	return a.observed(a.w.complete(sctx, &a.d))
}

// Fail records the attempt as failed with cause, its effects undone where
// the attempt can (a transactional attempt's, rolled back to the claim),
// and the key left for a later claim to take over. The write is fenced on
// the claim and tried again while the lease lasts, ctx's cancellation
// aside.
func (a *Attempt[M]) Fail(ctx context.Context, cause error) error {
	ctx, cancel := a.w.settleCtx(ctx, a.d.leaseTime)
	defer cancel()
	_, err := a.w.fail(ctx, &a.d, Failure{Error: cause.Error(), TTL: a.w.cfg.ttl})
	return a.observed(err)
}

// End lets go of what the attempt still holds. One ended without an
// outcome recorded leaves its key as it was claimed: a store claim is taken
// over once its lease lapses, a transactional attempt's claim rolls back
// with its transaction.
func (a *Attempt[M]) End(ctx context.Context) { a.d.att.end(ctx, &a.d) }

// observed feeds the outage tracker the result of a settling write, and
// returns its error. The caller leaving does not end the write (settleCtx),
// so its context excuses no failure.
func (a *Attempt[M]) observed(err error) error {
	a.w.observeOutcome(context.Background(), err)
	return err
}
