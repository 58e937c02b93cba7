package idemhttp

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/dedupkit/dedup"
)

// Defaults applied by [New] and [NewTx] when an option is not given.
const (
	DefaultHeader       = "Idempotency-Key"
	DefaultMaxBodyBytes = 1 << 20
	DefaultMaxSnapshot  = 1 << 20
	DefaultMinKeyBits   = 40
	DefaultRetryAfter   = time.Second

	// DefaultReplayCacheBytes is the replay cache's budget unless
	// WithReplayCache says otherwise: 8 MiB per middleware, a few
	// thousand typical answers of a kilobyte or two, the retries of a
	// busy minute, for a small share of a server's heap. An eighth of it,
	// 1 MiB, is DefaultMaxSnapshot: every answer stored is cached.
	DefaultReplayCacheBytes = 8 << 20
	// DefaultReplayCacheMaxAge is how long a cached answer is replayed
	// at most unless WithReplayCacheMaxAge says otherwise: 30 s, the
	// default lease, so that a record deleted by hand (see
	// WithReplayCache) is claimable again everywhere in the time an
	// operator already waits for a dead worker's key, while the retries
	// of a blip, which come within seconds, still hit the cache.
	DefaultReplayCacheMaxAge = 30 * time.Second
)

// The lease and retention a claim gets unless WithLease and WithTTL say
// otherwise: those of the core's Wrapper.
const (
	defaultLease = 30 * time.Second
	defaultTTL   = 7 * 24 * time.Hour
)

// defaultStoredHeaders are the response headers a snapshot keeps unless
// WithStoredHeaders names others.
var defaultStoredHeaders = canonicalNames("Content-Type", "Content-Language", "Content-Location", "Location", "ETag", "Last-Modified")

// canonicalNames returns names in their canonical form ("ETag" is kept as
// "Etag"), as a snapshot looks them up in a header map.
func canonicalNames(names ...string) []string {
	out := make([]string, len(names))
	for i, name := range names {
		out[i] = http.CanonicalHeaderKey(name)
	}
	return out
}

// defaultFinalStatuses are the 4xx answers stored and replayed like 2xx
// ones unless WithFinalStatuses names others.
var defaultFinalStatuses = []int{http.StatusBadRequest, http.StatusPaymentRequired, http.StatusUnprocessableEntity}

// Opt configures a [Middleware].
type Opt interface{ apply(*config) }

type optFunc func(*config)

func (f optFunc) apply(c *config) { f(c) }

type config struct {
	scope          string
	header         string
	headerKey      string // header, canonical: set by validate
	optional       bool
	tenant         func(*http.Request) (string, error)
	route          func(*http.Request) string
	policy         string
	maxBody        int64
	maxSnapshot    int
	minKeyBits     float64
	lease          time.Duration
	ttl            time.Duration
	retryAfter     time.Duration
	waitInFlight   time.Duration
	location       func(r *http.Request, key string) string
	conflictStatus int
	storedHeaders  []string
	final          map[int]bool
	problemBase    string
	logger         *slog.Logger
	jsonFP         dedup.FingerprintFunc
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider

	// outageThreshold is the core's WithOutageThreshold; 0: its default.
	outageThreshold time.Duration

	replayCache       int              // the replay cache's budget in bytes; 0: no cache
	replayCacheMaxAge time.Duration    // the longest a cached answer is replayed
	now               func() time.Time // the replay cache's clock; tests move it

	// newOnly names the options given that only [New] honours
	// (newOnlyOpt), in order, for [NewTx] to refuse (refuseNewOnly).
	newOnly []string
}

// newOnlyOpt is an option only [New] honours, a [TxMiddleware] having no
// use for it: set applies it, and its name is noted for [NewTx] to refuse
// it.
func newOnlyOpt(name string, set func(*config)) Opt {
	return optFunc(func(c *config) {
		set(c)
		c.newOnly = append(c.newOnly, name)
	})
}

// refuseNewOnly is the one rule for the options given to [NewTx] that it
// would ignore (newOnlyOpt): an error matching [dedup.ErrConfig] naming
// them; nil when there is none.
func (c *config) refuseNewOnly() error {
	if len(c.newOnly) == 0 {
		return nil
	}
	return fmt.Errorf("%w: idemhttp: NewTx cannot honour %s (only New does: a TxMiddleware's claim is its transaction's row lock): refused rather than ignored",
		dedup.ErrConfig, strings.Join(c.newOnly, ", "))
}

func defaultConfig() config {
	c := config{
		header:         DefaultHeader,
		route:          func(r *http.Request) string { return r.URL.Path },
		maxBody:        DefaultMaxBodyBytes,
		maxSnapshot:    DefaultMaxSnapshot,
		minKeyBits:     DefaultMinKeyBits,
		lease:          defaultLease,
		ttl:            defaultTTL,
		retryAfter:     DefaultRetryAfter,
		conflictStatus: http.StatusUnprocessableEntity,
		storedHeaders:  defaultStoredHeaders,
		problemBase:    DefaultProblemBase,
		logger:         slog.Default(),
		jsonFP:         dedup.JSONFingerprint(""),

		replayCache:       DefaultReplayCacheBytes,
		replayCacheMaxAge: DefaultReplayCacheMaxAge,
		now:               time.Now,
	}
	c.final = statusSet(defaultFinalStatuses)
	return c
}

func statusSet(codes []int) map[int]bool {
	m := make(map[int]bool, len(codes))
	for _, c := range codes {
		m[c] = true
	}
	return m
}

func (c *config) validate() error {
	var keyErr *dedup.KeyError
	if err := (dedup.Key{Scope: c.scope, EventID: "x"}).Validate(); errors.As(err, &keyErr) {
		return fmt.Errorf("%w: idemhttp: WithScope(%q): %s", dedup.ErrConfig, c.scope, keyErr.Reason)
	}
	switch {
	case http.CanonicalHeaderKey(c.header) == "" || !validToken(c.header):
		return fmt.Errorf("%w: idemhttp: WithHeader(%q): not a header name", dedup.ErrConfig, c.header)
	case c.route == nil || c.logger == nil:
		return fmt.Errorf("%w: idemhttp: nil route function or logger", dedup.ErrConfig)
	case c.maxBody <= 0 || c.maxSnapshot <= 0:
		return fmt.Errorf("%w: idemhttp: body and snapshot limits must be positive", dedup.ErrConfig)
	case c.minKeyBits < 0:
		return fmt.Errorf("%w: idemhttp: WithMinKeyEntropy(%v): must not be negative", dedup.ErrConfig, c.minKeyBits)
	case c.lease <= 0 || c.ttl <= 0 || c.retryAfter < 0:
		return fmt.Errorf("%w: idemhttp: lease and TTL must be positive, Retry-After not negative", dedup.ErrConfig)
	case c.ttl < c.lease:
		// A record that expires while its claim is held lets a retry sent
		// after it run the handler again.
		return fmt.Errorf("%w: idemhttp: WithTTL(%v) is shorter than the lease (%v): a retry sent after %v would run the handler again",
			dedup.ErrConfig, c.ttl, c.lease, c.ttl)
	case c.waitInFlight < 0:
		return fmt.Errorf("%w: idemhttp: WithWaitInFlight(%v): must not be negative", dedup.ErrConfig, c.waitInFlight)
	case c.outageThreshold < 0:
		return fmt.Errorf("%w: idemhttp: WithOutageThreshold(%v): must not be negative", dedup.ErrConfig, c.outageThreshold)
	case c.replayCache < 0 || c.replayCacheMaxAge <= 0:
		return fmt.Errorf("%w: idemhttp: WithReplayCache(%d), WithReplayCacheMaxAge(%v): the budget must not be negative, the max age must be positive",
			dedup.ErrConfig, c.replayCache, c.replayCacheMaxAge)
	case c.conflictStatus != http.StatusUnprocessableEntity && c.conflictStatus != http.StatusConflict:
		return fmt.Errorf("%w: idemhttp: WithConflictStatus(%d): must be 422 or 409", dedup.ErrConfig, c.conflictStatus)
	}
	for code := range c.final {
		if code < 400 || code > 499 {
			return fmt.Errorf("%w: idemhttp: WithFinalStatuses(%d): must be a 4xx status", dedup.ErrConfig, code)
		}
	}
	for _, h := range c.storedHeaders {
		if !validToken(h) {
			return fmt.Errorf("%w: idemhttp: WithStoredHeaders(%q): not a header name", dedup.ErrConfig, h)
		}
	}
	c.headerKey = http.CanonicalHeaderKey(c.header)
	return nil
}

// WithScope sets the namespace keys are unique in, for example "payments-api".
// It is required. Keep it stable: a changed scope makes every key new again.
func WithScope(scope string) Opt { return optFunc(func(c *config) { c.scope = scope }) }

// WithHeader sets the request header carrying the key (default
// "Idempotency-Key").
func WithHeader(name string) Opt { return optFunc(func(c *config) { c.header = name }) }

// WithOptionalKey lets requests without the key header through to the
// handler, without deduplication. By default a missing key is a 400.
func WithOptionalKey() Opt { return optFunc(func(c *config) { c.optional = true }) }

// WithTenant sets the function naming the caller a request comes from,
// normally the authenticated principal. Keys then live in that tenant's own
// scope ([dedup.TenantScope]): one caller can never replay another's stored
// response by sending its key. A request whose tenant is empty or an error
// gets a 403 problem. Without it, all callers share one key space.
func WithTenant(f func(*http.Request) (string, error)) Opt {
	return optFunc(func(c *config) { c.tenant = f })
}

// WithRoute sets the function naming the operation a request invokes, part of
// the fingerprint (default: the URL path, so one key sent to /accounts/1/pay
// and /accounts/2/pay conflicts). A coarser route, such as the mux pattern
// r.Pattern, makes requests differing only in the path's wildcards the same
// operation: use one only when the body names them too.
func WithRoute(f func(*http.Request) string) Opt { return optFunc(func(c *config) { c.route = f }) }

// WithPolicyVersion adds a version to the fingerprint. Changing it makes the
// keys already answered conflict instead of replaying: bump it only when an
// old answer must not be replayed for the same request. Left alone, a retry
// after a rule change replays the decision of the first attempt.
func WithPolicyVersion(v string) Opt { return optFunc(func(c *config) { c.policy = v }) }

// WithMaxBodyBytes bounds the request body read for the fingerprint (default
// 1 MiB); a longer body gets a 413 problem and the handler does not run.
func WithMaxBodyBytes(n int64) Opt { return optFunc(func(c *config) { c.maxBody = n }) }

// WithMaxSnapshotBytes bounds the stored response (default 1 MiB). A larger
// response is answered but not stored, and the key is left retryable with a
// logged warning: a retry runs the handler again.
func WithMaxSnapshotBytes(n int) Opt { return optFunc(func(c *config) { c.maxSnapshot = n }) }

// WithMinKeyEntropy sets the least estimated entropy, in bits, a key must
// carry (default 40; 0 disables the check). The estimate is the key's length
// times the Shannon entropy of its characters: a UUID has about 130 bits,
// "1234567890" about 33, "aaaaaaaaaaaa" none.
func WithMinKeyEntropy(bits float64) Opt { return optFunc(func(c *config) { c.minKeyBits = bits }) }

// WithLease sets how long a claim stays exclusive between heartbeats
// (default 30 s). The lease is extended every third of it while the handler
// runs; a server that dies holding it releases the key after at most this
// long. It is for [New] only: [NewTx], whose claim is its transaction's row
// lock, refuses it with [dedup.ErrConfig].
func WithLease(d time.Duration) Opt { return newOnlyOpt("WithLease", func(c *config) { c.lease = d }) }

// WithTTL sets how long answers are kept for replay (default 7 days). One
// shorter than the lease (WithLease, default 30 s) is refused with
// [dedup.ErrConfig]: the key would be free again while its request runs.
func WithTTL(d time.Duration) Opt { return optFunc(func(c *config) { c.ttl = d }) }

// WithRetryAfter sets the Retry-After of the answer to a request whose key
// is still in flight (default 1 s).
func WithRetryAfter(d time.Duration) Opt { return optFunc(func(c *config) { c.retryAfter = d }) }

// WithWaitInFlight makes a request whose key is in flight wait up to d for
// the first request's outcome instead of being answered 409 at once: it
// replays the answer once stored, runs the handler itself if the first left
// the key retryable (or its lease lapsed), and gets the 409 (or
// [WithInFlightAccepted]'s 202) only past d or when its own request ends.
// It waits between claims, so it holds no store connection meanwhile, and
// works across instances sharing the store. Off by default (d = 0), as the
// draft answers 409. A [TxMiddleware] waits on the key's row lock already:
// [NewTx] refuses this option with [dedup.ErrConfig].
func WithWaitInFlight(d time.Duration) Opt {
	return newOnlyOpt("WithWaitInFlight", func(c *config) { c.waitInFlight = d })
}

// WithOutageThreshold sets how long the store must keep failing to claim
// keys or record answers before Health reports an outage (default 30 s, as
// [dedup.WithOutageThreshold]).
func WithOutageThreshold(d time.Duration) Opt {
	return optFunc(func(c *config) { c.outageThreshold = d })
}

// WithInFlightAccepted answers a request whose key is still in flight with
// 202 Accepted and a Location the client can poll, given by location,
// instead of 409 Conflict.
func WithInFlightAccepted(location func(r *http.Request, key string) string) Opt {
	return optFunc(func(c *config) { c.location = location })
}

// WithConflictStatus sets the status answering a key reused for another
// request: 422 (the default, as the draft says) or 409.
func WithConflictStatus(code int) Opt { return optFunc(func(c *config) { c.conflictStatus = code }) }

// WithStoredHeaders sets the response headers a snapshot keeps and a replay
// sends (default Content-Type, Content-Language, Content-Location, Location,
// ETag and Last-Modified). Leave out Set-Cookie and other headers made for
// one caller or one moment.
func WithStoredHeaders(names ...string) Opt {
	names = canonicalNames(names...)
	return optFunc(func(c *config) { c.storedHeaders = names })
}

// WithFinalStatuses sets the 4xx statuses stored and replayed like 2xx ones
// (default 400, 402 and 422: the request itself was refused, so repeating it
// cannot change the answer). Any other status leaves the key retryable.
func WithFinalStatuses(codes ...int) Opt {
	set := statusSet(codes)
	return optFunc(func(c *config) { c.final = set })
}

// WithProblemTypeBase sets the URI prefix of the problem types the middleware
// answers with (default [DefaultProblemBase]); each type is the prefix plus
// a fixed name such as "key-reused".
func WithProblemTypeBase(uri string) Opt { return optFunc(func(c *config) { c.problemBase = uri }) }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Opt { return optFunc(func(c *config) { c.logger = l }) }

// WithReplayCache sets the bytes of settled answers each middleware keeps
// in process for replay (default [DefaultReplayCacheBytes], 8 MiB; 0 turns
// the cache off). A retry of a key this middleware answered or replayed
// lately is then answered from memory, byte for byte as from the store,
// with no store call: the same replay, or the same refusal of a changed
// request. Least recently used answers go first when the budget is spent;
// an answer over an eighth of it is not cached. An answer is never kept
// past its record's expiry (WithTTL) nor past [WithReplayCacheMaxAge].
//
// A settled record does not change, so the cache can only be out of date
// when a record is deleted by hand (a DELETE on the table, a Redis DEL) or
// the store is emptied: an instance that cached the key goes on replaying
// it until the max age passes. The count of bytes is approximate: the
// answer's body and headers, the key, the fingerprint, the request kept to
// compare retries with, and a fixed overhead per entry.
func WithReplayCache(maxBytes int) Opt { return optFunc(func(c *config) { c.replayCache = maxBytes }) }

// WithReplayCacheMaxAge sets the longest a cached answer is replayed
// (default [DefaultReplayCacheMaxAge], 30 s): how long, at most, an
// instance replays a key whose record was deleted by hand elsewhere. It
// must be positive; WithReplayCache(0) turns the cache off.
func WithReplayCacheMaxAge(d time.Duration) Opt {
	return optFunc(func(c *config) { c.replayCacheMaxAge = d })
}
