package idemhttp

import (
	"context"
	"fmt"
	"net/http"
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
type Middleware struct{ front }

// New returns a Middleware over store. [WithScope] is required.
func New(store dedup.Store, opts ...Opt) (*Middleware, error) {
	if nilcheck.IsNil(store) {
		return nil, fmt.Errorf("%w: idemhttp: nil store", dedup.ErrConfig)
	}
	f, err := newFront(opts)
	if err != nil {
		return nil, err
	}
	if f.core, err = dedup.NewFront(store, serveNext, f.coreOpts()...); err != nil {
		return nil, err
	}
	return &Middleware{front: f}, nil
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
		case !m.ready(w, r, p):
			return
		}
		c, att, err := m.claim(r.Context(), p)
		switch {
		case err != nil:
			m.storeError(w, p, "claim", err)
		case att == nil:
			m.answerClaim(w, r, p, c)
		default:
			p.expires = c.Record.ExpiresAt
			x := &p.x
			*x = exchange{r: r, rec: newRecorder(m.recorders, w, m.cfg.maxSnapshot, true), next: next}
			m.attempt(w, p, att, x)
			x.rec.release(m.recorders)
		}
	}))
}

// waitPause is the pause between claims of a request waiting for its key
// (WithWaitInFlight): short at first, for handlers that answer in
// milliseconds, then longer, so that waiters do not load the store; the
// jitter spreads waiters that arrived together.
var waitPause = dedup.ExponentialBackoff(10*time.Millisecond, 200*time.Millisecond)

// claim claims p's key; an acquired claim comes with its attempt. With
// WithWaitInFlight, a key in flight is claimed again after a pause, until
// it is no longer in flight, the wait is over or the request ends.
func (m *Middleware) claim(ctx context.Context, p *prepared) (dedup.Claim, *dedup.Attempt[*exchange], error) {
	c, att, err := m.core.Claim(ctx, p.key, p.fingerprint)
	if err != nil || c.Status != dedup.ClaimInFlight || m.cfg.waitInFlight <= 0 {
		return c, att, err
	}
	deadline := time.Now().Add(m.cfg.waitInFlight)
	for n := 1; c.Status == dedup.ClaimInFlight; n++ {
		wait := min(waitPause(n), time.Until(deadline))
		if wait <= 0 {
			return c, nil, nil
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return c, nil, nil
		}
		if c, att, err = m.core.Claim(ctx, p.key, p.fingerprint); err != nil {
			return c, nil, err
		}
	}
	return c, att, nil
}
