package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/dedupkit/dedup"
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
	if isNil(store) {
		return nil, fmt.Errorf("%w: idemhttp: nil store", dedup.ErrConfig)
	}
	f, err := newFront(opts)
	if err != nil {
		return nil, err
	}
	return &Middleware{front: f, store: store}, nil
}

// isNil reports whether v is nil or a nil pointer inside an interface.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
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
		c, err := m.store.Claim(r.Context(), p.claimRequest(m.cfg))
		if err != nil {
			m.storeError(w, p, "claim", err)
			return
		}
		if c.Status != dedup.ClaimAcquired {
			m.answerClaim(w, r, p, c)
			return
		}
		m.run(w, r, next, p, c.Record.Owner)
	}))
}

// run runs the handler for an acquired claim and settles the key.
//
// The handler sees the request's context, cancelled when the client goes
// away; the heartbeat and the settling writes do not: the claim is held for
// as long as the handler runs, whether anyone waits for its answer or not,
// so a retry never runs the operation beside it.
func (m *Middleware) run(w http.ResponseWriter, r *http.Request, next http.Handler, p *prepared, owner string) {
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	stopBeat := m.heartbeat(context.WithoutCancel(r.Context()), cancel, p.key, owner)
	defer stopBeat() // also when the handler ends the goroutine (runtime.Goexit)
	rec := newRecorder(w, m.cfg.maxSnapshot, true)
	panicked, value := serve(next, rec, r.WithContext(ctx))
	stopBeat() // before settling, so no extension races the settling write

	sctx, scancel := context.WithTimeout(context.WithoutCancel(r.Context()), m.cfg.lease)
	defer scancel()
	fail := func(reason string) {
		err := m.store.Fail(sctx, p.key, owner, dedup.Failure{Error: reason, TTL: m.cfg.ttl})
		if err != nil {
			m.cfg.logger.Warn("idemhttp: could not leave the key retryable; it is freed when its lease lapses",
				slog.String("key", p.key.String()), slog.String("reason", reason), slog.Any("error", err))
		}
	}
	switch {
	case panicked:
		fail(fmt.Sprintf("handler panic: %v", value))
		panic(value)
	case rec.over:
		fail("response over the snapshot limit")
		m.cfg.logger.Warn("idemhttp: response answered but not stored (over the snapshot limit); a retry runs the handler again",
			slog.String("key", p.key.String()), slog.Int("limit", m.cfg.maxSnapshot))
		return
	case !m.storable(ctx, rec):
		fail("status " + strconv.Itoa(rec.status))
		m.answer(ctx, w, rec)
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
	err = m.complete(sctx, p.key, owner, snap)
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

// answer sends an answer that is not stored: the handler's own, or, when
// its request ended before it wrote anything, a problem saying why.
func (f *front) answer(ctx context.Context, w http.ResponseWriter, rec *recorder) {
	switch {
	case rec.wrote || ctx.Err() == nil:
		rec.flush()
	case errors.Is(context.Cause(ctx), errLeaseLost):
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
func (f *front) storable(ctx context.Context, rec *recorder) bool {
	if !rec.wrote && ctx.Err() != nil {
		return false
	}
	return (rec.status >= 200 && rec.status < 300) || f.cfg.final[rec.status]
}

// serve runs h, reporting a panic instead of letting it through.
func serve(h http.Handler, w http.ResponseWriter, r *http.Request) (panicked bool, value any) {
	defer func() {
		if v := recover(); v != nil {
			panicked, value = true, v
		}
	}()
	h.ServeHTTP(w, r)
	return false, nil
}

// Bounds of the waits between tries of a completion.
const (
	retryMin = 50 * time.Millisecond
	retryMax = time.Second
)

// complete stores the snapshot, trying again while the store fails for
// another reason than a lost lease and ctx lasts: the claim is still ours.
func (m *Middleware) complete(ctx context.Context, key dedup.Key, owner string, snap []byte) error {
	wait := retryMin
	for tries := 1; ; tries++ {
		err := m.store.Complete(ctx, key, owner, snap, m.cfg.ttl)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, dedup.ErrLeaseLost):
			if tries > 1 { // an earlier try may have landed, its answer lost
				if rec, gerr := m.store.Get(ctx, key); gerr == nil && rec.Owner == owner && rec.Status == dedup.StatusSucceeded {
					return nil
				}
			}
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, retryMax)
	}
}

// errLeaseLost is the cause of a handler's cancellation by its heartbeat.
var errLeaseLost = errors.New("idemhttp: the key's lease was lost")

// heartbeat extends the lease every third of its length until stop is
// called, and calls cancel when the lease is lost. Its extensions run on ctx,
// which must outlive the request (the handler may run on after its client
// left); stop cancels an extension in progress and waits for it, and may be
// called more than once. It runs on a timer, so a request that ends within a
// third of its lease starts no goroutine.
func (m *Middleware) heartbeat(ctx context.Context, cancel context.CancelCauseFunc, key dedup.Key, owner string) (stop func()) {
	ctx, end := context.WithCancel(ctx)
	var (
		mu      sync.Mutex // guards stopped and the timer's resets
		stopped bool
		running sync.WaitGroup // an extension in progress
		timer   *time.Timer
	)
	beat := func() {
		mu.Lock()
		if stopped {
			mu.Unlock()
			return
		}
		running.Add(1)
		mu.Unlock()
		defer running.Done()
		err := m.store.Extend(ctx, key, owner, m.cfg.lease)
		switch {
		case errors.Is(err, dedup.ErrLeaseLost):
			cancel(errLeaseLost)
			return
		case err != nil && ctx.Err() == nil:
			m.cfg.logger.Warn("idemhttp: lease extension failed", slog.String("key", key.String()), slog.Any("error", err))
		}
		mu.Lock()
		if !stopped {
			timer.Reset(m.cfg.lease / 3)
		}
		mu.Unlock()
	}
	mu.Lock()
	timer = time.AfterFunc(m.cfg.lease/3, beat)
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		timer.Stop()
		mu.Unlock()
		end()
		running.Wait()
	}
}
