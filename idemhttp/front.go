package idemhttp

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/hexsha"
	"github.com/dedupkit/dedup/internal/nilcheck"
)

// front is what both modes share: reading a request into a claim,
// answering every claim but an acquired one, and settling an acquired one
// on the core's attempt (attempt.go).
type front struct {
	cfg   config
	tel   *httpTelemetry          // nil: no spans, no metrics
	core  *dedup.Front[*exchange] // claims keys and holds them: the mode's
	cache *replayCache            // settled answers; nil: none kept
	// recorders keeps the recorders of answered requests for the next
	// ones: a new key's response is buffered without allocating one.
	recorders *sync.Pool
}

// Health returns nil, or an error matching [dedup.ErrOutage] while the
// store has kept failing to claim keys or to record answers for
// [WithOutageThreshold] or longer: a readiness probe can serve it.
func (f *front) Health() error { return f.core.Health() }

// coreOpts are the options of the core's Front, from the middleware's.
func (f *front) coreOpts() []dedup.Opt {
	opts := []dedup.Opt{dedup.WithLease(f.cfg.lease), dedup.WithTTL(f.cfg.ttl), dedup.WithLogger(f.cfg.logger)}
	if f.cfg.outageThreshold > 0 {
		opts = append(opts, dedup.WithOutageThreshold(f.cfg.outageThreshold))
	}
	return opts
}

func newFront(opts []Opt) (front, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		if nilcheck.IsNil(o) {
			return front{}, fmt.Errorf("%w: idemhttp: nil option", dedup.ErrConfig)
		}
		o.apply(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return front{}, err
	}
	tel, err := newHTTPTelemetry(&cfg)
	if err != nil {
		return front{}, fmt.Errorf("%w: idemhttp: OpenTelemetry instruments: %w", dedup.ErrConfig, err)
	}
	return front{cfg: cfg, tel: tel, cache: newReplayCache(cfg.replayCache, cfg.replayCacheMaxAge, cfg.now), recorders: new(sync.Pool)}, nil
}

// prepared is a request on its way to claim its key.
type prepared struct {
	key              dedup.Key
	shape            requestShape
	fingerprint      string // set by ready, sharing fingerprintBytes
	fingerprintBytes [hexsha.Size]byte
	expires          time.Time // the expiry of the record its claim acquired, if it did
	body             bodyCopy  // the body given back to the handler, kept here to cost no allocation of its own
	x                exchange  // its attempt's, once acquired, kept here for the same reason
}

// prepare reads the key, the caller and the body of r. It answers w itself
// and returns ok false when the request is refused, and returns a nil
// *prepared when the request has no key and may go through without one.
func (f *front) prepare(w http.ResponseWriter, r *http.Request) (p *prepared, ok bool) {
	id, present, kp := f.cfg.requestKey(r)
	switch {
	case kp != nil:
		f.refuse(w, kp)
		return nil, false
	case !present && f.cfg.optional:
		return nil, true
	case !present:
		f.refuse(w, &keyProblem{ProblemKeyMissing, "this operation requires an " + f.cfg.header + " header"})
		return nil, false
	}
	scope := f.cfg.scope
	if f.cfg.tenant != nil {
		tenant, err := f.cfg.tenant(r)
		if err == nil && tenant == "" {
			err = errors.New("no caller")
		}
		if err != nil {
			f.cfg.writeProblem(w, ProblemTenant, http.StatusForbidden, err.Error(), 0)
			return nil, false
		}
		scope = dedup.TenantScope(scope, tenant)
	}
	p = &prepared{key: dedup.Key{Scope: scope, EventID: id}}
	// The ID is printable ASCII and the scope the config's, valid both; a
	// tenant's name may not be.
	if f.cfg.tenant != nil && p.key.Validate() != nil {
		f.cfg.writeProblem(w, ProblemTenant, http.StatusForbidden, "the caller's name cannot scope a key", 0)
		return nil, false
	}
	body, kp := f.cfg.readBody(r, &p.body)
	if kp != nil {
		f.refuse(w, kp)
		return nil, false
	}
	p.shape = f.cfg.shapeOf(r, body)
	return p, true
}

// ready answers p from the replay cache when it holds p's key, and
// otherwise fingerprints p for its claim. It reports whether p is ready to
// claim: false when w was answered, from the cache or with a refusal.
//
// A request byte for byte like the one whose answer the cache holds (see
// requestShape) is answered without a fingerprint; any other is answered
// as a claim finding the key settled would be: by the stores' own rule
// (deduptype.Classify), the stored response for the same request and the
// conflict for another.
func (f *front) ready(w http.ResponseWriter, r *http.Request, p *prepared) bool {
	e, cached := f.cache.get(p.key)
	if cached && e.fits(&p.shape) {
		e.writeReplay(w)
		return false
	}
	var kp *keyProblem
	if !cached {
		kp = f.cfg.guessable(p.key.EventID)
	}
	if kp == nil {
		p.fingerprint, kp = f.cfg.fingerprint(r, p.shape.body, &p.fingerprintBytes)
	}
	if kp != nil {
		f.refuse(w, kp)
		return false
	}
	if !cached {
		return true
	}
	settled := dedup.Record{Key: p.key, Status: dedup.StatusSucceeded, Fingerprint: e.fingerprint()}
	if status := deduptype.Classify(settled, p.fingerprint); status != dedup.ClaimDuplicate {
		f.answerClaim(w, r, p, dedup.Claim{Status: status, Record: settled})
		return false
	}
	e.writeReplay(w)
	return false
}

func (f *front) refuse(w http.ResponseWriter, kp *keyProblem) {
	status := http.StatusBadRequest
	if kp.problem == ProblemBodyTooLarge {
		status = http.StatusRequestEntityTooLarge
	}
	f.cfg.writeProblem(w, kp.problem, status, kp.detail, 0)
}

// answerClaim answers a claim that was not acquired.
func (f *front) answerClaim(w http.ResponseWriter, r *http.Request, p *prepared, c dedup.Claim) {
	switch c.Status {
	case dedup.ClaimDuplicate:
		f.replay(w, p, c.Record)
	case dedup.ClaimInFlight:
		if f.cfg.location != nil {
			h := w.Header()
			h.Set("Location", f.cfg.location(r, p.key.EventID))
			h.Set("Retry-After", retryAfterValue(f.cfg.retryAfter))
			w.WriteHeader(http.StatusAccepted)
			return
		}
		f.cfg.writeProblem(w, ProblemInFlight, http.StatusConflict,
			"a request with this key has not finished; retry later", f.cfg.retryAfter)
	case dedup.ClaimConflict:
		f.answerConflict(w)
	default: // ClaimFinal: another writer parked the key for good
		f.cfg.writeProblem(w, ProblemKeyReused, f.cfg.conflictStatus,
			"this key was settled as failed for good", 0)
	}
}

// answerConflict answers a request whose key was used for another request.
func (f *front) answerConflict(w http.ResponseWriter) {
	f.cfg.writeProblem(w, ProblemKeyReused, f.cfg.conflictStatus,
		"this key was used for a request with another method, route, query or body", 0)
}

// cacheSettled caches snap, the answer of p's key that the store has just
// accepted, until the record's expiry: that of p's claim, which the
// completion only pushes later, or the TTL from now if earlier (a store
// whose clock runs ahead).
func (f *front) cacheSettled(p *prepared, snap []byte) {
	if f.cache == nil {
		return
	}
	var parts snapshotParts
	if parts.parse(snap) != nil { // encodeSnapshot made it: never
		return
	}
	expires := f.cfg.now().Add(f.cfg.ttl)
	if !p.expires.IsZero() && p.expires.Before(expires) {
		expires = p.expires
	}
	f.cache.put(p.key, p.fingerprint, &p.shape, &parts, expires)
}

// replay answers with the stored response, marked as a replay, and keeps
// it in the replay cache: when it is kept, the answer is written from the
// cache's entry, whose strings cost no copy of their own.
func (f *front) replay(w http.ResponseWriter, p *prepared, rec dedup.Record) {
	var parts snapshotParts
	err := parts.parse(rec.Result)
	if err == nil {
		err = parts.validate()
	}
	if err != nil {
		f.cfg.logger.Error("idemhttp: stored response unreadable; not replayed",
			slog.Any("key", p.key), slog.Any("error", err))
		f.cfg.writeProblem(w, ProblemStoredMalformed, http.StatusInternalServerError,
			"the stored answer for this key cannot be read", 0)
		return
	}
	if e, ok := f.cache.put(p.key, rec.Fingerprint, &p.shape, &parts, rec.ExpiresAt); ok {
		e.writeReplay(w)
		return
	}
	var s snapshot
	parts.split(&s)
	s.writeReplay(w)
}

// keyAttr names p's key in logs, as scope/id.
func keyAttr(p *prepared) slog.Attr {
	if p == nil {
		return slog.String("key", "(none)")
	}
	return slog.Any("key", p.key)
}

// storeError answers a request the store could not serve.
func (f *front) storeError(w http.ResponseWriter, p *prepared, op string, err error) {
	f.cfg.logger.Warn("idemhttp: store "+op+" failed", keyAttr(p), slog.Any("error", err))
	f.cfg.writeProblem(w, ProblemStore, http.StatusServiceUnavailable,
		"the idempotency store is unavailable; retry with the same key", f.cfg.retryAfter)
}
