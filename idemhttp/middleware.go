package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/nilcheck"
)

// ReplayHeader marks a replayed response: its value is "true" on every
// answer served from a stored snapshot instead of by the handler.
const ReplayHeader = "Idempotent-Replayed"

// Middleware makes a net/http handler idempotent per Idempotency-Key over
// any [dedup.Store]: the first request with a key runs the handler and its
// response is stored; a retry with the same key and request replays it.
type Middleware struct {
	front
	store dedup.Store
}

// New returns a Middleware over store. [WithScope] is required.
func New(store dedup.Store, opts ...Opt) (*Middleware, error) {
	if nilcheck.IsNil(store) {
		return nil, fmt.Errorf("%w: idemhttp: nil store", dedup.ErrConfig)
	}
	f, err := newFront(opts)
	if err != nil {
		return nil, err
	}
	return &Middleware{front: f, store: store}, nil
}

// Wrap returns next behind the middleware. It panics if next is nil, as
// http.Handle does.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	if next == nil {
		panic("idemhttp: Wrap(nil)")
	}
	return m.tel.instrument(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := m.prepare(w, r)
		switch {
		case !ok:
			return
		case p == nil:
			next.ServeHTTP(w, r)
			return
		}
		c, err := m.claim(r.Context(), p)
		if err != nil {
			m.storeError(w, p, "claim", err)
			return
		}
		if c.Status != dedup.ClaimAcquired {
			m.answerClaim(w, r, p, c)
			return
		}
		m.run(w, r, next, p, c)
	}))
}

// waitPause is the pause between claims of a request waiting for its key
// (WithWaitInFlight): short at first, for handlers that answer in
// milliseconds, then longer, so that waiters do not load the store; the
// jitter spreads waiters that arrived together.
var waitPause = dedup.ExponentialBackoff(10*time.Millisecond, 200*time.Millisecond)

// claim claims p's key. With WithWaitInFlight, a key in flight is claimed
// again after a pause, until it is no longer in flight, the wait is over or
// the request ends.
func (m *Middleware) claim(ctx context.Context, p *prepared) (dedup.Claim, error) {
	req := p.claimRequest(m.cfg)
	c, err := m.store.Claim(ctx, req)
	if err != nil || c.Status != dedup.ClaimInFlight || m.cfg.waitInFlight <= 0 {
		return c, err
	}
	deadline := time.Now().Add(m.cfg.waitInFlight)
	for attempt := 1; c.Status == dedup.ClaimInFlight; attempt++ {
		wait := min(waitPause(attempt), time.Until(deadline))
		if wait <= 0 {
			return c, nil
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return c, nil
		}
		if c, err = m.store.Claim(ctx, req); err != nil {
			return c, err
		}
	}
	return c, nil
}

// run runs the handler for an acquired claim and settles the key.
//
// The handler sees the request's context, cancelled when the client goes
// away; the heartbeat and the settling writes do not: the claim is held for
// as long as the handler runs, whether anyone waits for its answer or not,
// so a retry never runs the operation beside it.
func (m *Middleware) run(w http.ResponseWriter, r *http.Request, next http.Handler, p *prepared, c dedup.Claim) {
	held, err := holdClaim(m.store, c, m.cfg.lease, m.cfg.logger)
	if err != nil {
		m.storeError(w, p, "claim", err)
		return
	}
	rec := newRecorder(w, m.cfg.maxSnapshot, true)
	var ended error // why the handler's request ended before it returned, if it did
	err = held.Run(r.Context(), func(ctx context.Context) error {
		next.ServeHTTP(rec, r.WithContext(ctx))
		ended = endedCause(ctx)
		return nil
	})

	sctx, scancel := context.WithTimeout(context.WithoutCancel(r.Context()), m.cfg.lease)
	defer scancel()
	fail := func(reason string) {
		if err := held.Fail(sctx, dedup.Failure{Error: reason, TTL: m.cfg.ttl}); err != nil {
			m.cfg.logger.Warn("idemhttp: could not leave the key retryable; it is freed when its lease lapses",
				slog.String("key", p.key.String()), slog.String("reason", reason), slog.Any("error", err))
		}
	}
	switch {
	case err != nil:
		// held.Run returns an error only for a panic: the handler's own
		// error is not returned to it.
		perr := panicOf(err)
		fail(fmt.Sprintf("handler panic: %v", perr.Value))
		panic(perr.Value)
	case rec.over:
		fail("response over the snapshot limit")
		m.cfg.logger.Warn("idemhttp: response answered but not stored (over the snapshot limit); a retry runs the handler again",
			slog.String("key", p.key.String()), slog.Int("limit", m.cfg.maxSnapshot))
		return
	case !m.storable(ended, rec):
		fail("status " + strconv.Itoa(rec.status))
		m.answer(ended, w, rec)
		return
	}
	snap, err := encodeSnapshot(rec.status, rec.header, m.cfg.storedHeaders, rec.body.Bytes())
	if err != nil {
		fail("response not storable")
		m.cfg.logger.Warn("idemhttp: response answered but not stored (its headers could not be replayed); a retry runs the handler again",
			slog.String("key", p.key.String()), slog.Any("error", err))
		rec.flush()
		return
	}
	err = held.Complete(sctx, snap, m.cfg.ttl)
	switch {
	case errors.Is(err, dedup.ErrLeaseLost):
		m.cfg.logger.Error("idemhttp: handler outlived its lease; its response was not stored and another request may have run it again",
			slog.String("key", p.key.String()), slog.Any("error", err))
		m.cfg.writeProblem(w, ProblemLeaseLost, http.StatusServiceUnavailable,
			"the request took longer than its lease; retry to get the stored answer", m.cfg.retryAfter)
	case err != nil:
		// The effect is done but not recorded: answering it is the best
		// the client can get; a retry after the lease would run it again.
		m.cfg.logger.Error("idemhttp: response answered but not stored; a retry after the lease runs the handler again",
			slog.String("key", p.key.String()), slog.Any("error", err))
		rec.flush()
	default:
		rec.flush()
	}
}

// panicOf returns the *dedup.PanicError that err, an error of held.Run, is.
// Kept out of run so that the target of errors.As escapes only after a
// panic.
func panicOf(err error) *dedup.PanicError {
	var perr *dedup.PanicError
	if !errors.As(err, &perr) {
		return &dedup.PanicError{Value: err}
	}
	return perr
}

// answer sends an answer that is not stored: the handler's own, or, when
// its request ended (ended, see endedCause) before it wrote anything, a
// problem saying why.
func (f *front) answer(ended error, w http.ResponseWriter, rec *recorder) {
	switch {
	case rec.wrote || ended == nil:
		rec.flush()
	case errors.Is(ended, dedup.ErrLeaseLost):
		f.cfg.writeProblem(w, ProblemLeaseLost, http.StatusServiceUnavailable,
			"the request's claim on its key was lost; retry with the same key", f.cfg.retryAfter)
	default:
		f.cfg.writeProblem(w, ProblemAbandoned, http.StatusServiceUnavailable,
			"the request ended before the handler answered; retry with the same key", f.cfg.retryAfter)
	}
}

// storable reports whether a recorded answer is final: a 2xx or a final
// 4xx, written by the handler or returned normally. A handler whose request
// ended (client gone, timeout, lease lost) without writing anything
// answered nothing.
func (f *front) storable(ended error, rec *recorder) bool {
	if !rec.wrote && ended != nil {
		return false
	}
	return (rec.status >= 200 && rec.status < 300) || f.cfg.final[rec.status]
}

// endedCause returns why ctx ended, or nil while it has not.
func endedCause(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	return context.Cause(ctx)
}
