// Package dedupui is the operator's console of dedup: an [http.Handler] a
// service mounts behind its own authentication, showing the records of a
// store (by status per scope, the stuck and failed-final lists, one record's
// full story) and an outbox's backlog and failures, with actions to release
// or forget a record and requeue failed events when [WithActions] is given.
//
//	mux.Handle("/dedup/", http.StripPrefix("/dedup", dedupui.New(store, dedupui.WithOutbox(ob, pool))))
//
// Pages are rendered on the server with html/template and work without
// JavaScript; every asset is embedded. The security model (actions off by
// default, confirmation, cross-origin protection, the caller logged) is in
// docs/operations.md, "The console (dedupui)".
package dedupui

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/nilcheck"
	"github.com/dedupkit/dedup/outbox"
)

// DefaultPageSize is how many records or events a list shows per page
// unless [WithPageSize] says otherwise.
const DefaultPageSize = 50

// maxPageSize bounds WithPageSize: a page is one indexed range read.
const maxPageSize = 1000

// window is how far back the charts go.
const window = time.Hour

// Opt configures the console.
type Opt interface{ apply(*config) }

type optFunc func(*config)

func (f optFunc) apply(c *config) { f(c) }

type config struct {
	outbox   *outbox.Outbox
	db       outbox.DB
	actions  bool
	payloads bool
	caller   func(*http.Request) string
	logger   *slog.Logger
	pageSize int
}

// WithOutbox shows the outbox o, read and requeued through db (usually the
// service's pool).
func WithOutbox(o *outbox.Outbox, db outbox.DB) Opt {
	return optFunc(func(c *config) { c.outbox, c.db = o, db })
}

// WithActions enables the actions: releasing a stuck record, forgetting a
// record and requeueing failed outbox events. Without it the console is
// read-only: no action is offered and an action's request is refused with
// 403 Forbidden.
func WithActions() Opt { return optFunc(func(c *config) { c.actions = true }) }

// WithPayloads shows the results stored with records. Without it a page
// shows a result's size only.
func WithPayloads() Opt { return optFunc(func(c *config) { c.payloads = true }) }

// WithCaller names who made a request, from the service's own
// authentication, for the log of actions (default: nobody, logged as
// "unknown").
func WithCaller(f func(*http.Request) string) Opt {
	return optFunc(func(c *config) { c.caller = f })
}

// WithLogger sets the logger of actions and failed pages (default
// slog.Default()).
func WithLogger(l *slog.Logger) Opt { return optFunc(func(c *config) { c.logger = l }) }

// WithPageSize sets how many records or events a list shows per page
// (default [DefaultPageSize], at most 1000; a value out of range keeps the
// default).
func WithPageSize(n int) Opt { return optFunc(func(c *config) { c.pageSize = n }) }

// console is the handler New returns.
type console struct {
	cfg    config
	store  dedup.Store
	browse dedup.Browser // nil when the store has none
	admin  dedup.Admin   // nil when the store has none
	mux    *http.ServeMux
	guard  *http.CrossOriginProtection
}

// New returns the console of store. The store's optional interfaces are
// resolved once: [dedup.Browser] for the overview and the lists,
// [dedup.Admin] for the actions on records; a store without them shows
// records by key, and says what it cannot show. A nil store gives a
// handler that answers every request with 500 and says so.
func New(store dedup.Store, opts ...Opt) http.Handler {
	if nilcheck.IsNil(store) {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "dedupui: the console was made without a store (dedupui.New(nil))", http.StatusInternalServerError)
		})
	}
	cfg := config{pageSize: DefaultPageSize, logger: slog.Default(), caller: func(*http.Request) string { return "" }}
	for _, o := range opts {
		o.apply(&cfg)
	}
	if cfg.pageSize <= 0 || cfg.pageSize > maxPageSize {
		cfg.pageSize = DefaultPageSize
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	if cfg.caller == nil {
		cfg.caller = func(*http.Request) string { return "" }
	}
	c := &console{cfg: cfg, store: store, mux: http.NewServeMux(), guard: http.NewCrossOriginProtection()}
	c.browse, _ = store.(dedup.Browser)
	c.admin, _ = store.(dedup.Admin)
	c.routes()
	return c
}

// ServeHTTP serves the console's pages.
func (c *console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'")
	w.Header().Set("Referrer-Policy", "same-origin")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	c.mux.ServeHTTP(w, r)
}

func (c *console) routes() {
	c.mux.HandleFunc("GET /{$}", c.overview)
	c.mux.HandleFunc("GET /record", c.record)
	c.mux.HandleFunc("GET /stuck", c.list(dedup.ListStuck))
	c.mux.HandleFunc("GET /failed", c.list(dedup.ListFailedFinal))
	c.mux.HandleFunc("GET /outbox", c.outboxPage)
	c.mux.Handle("GET /static/", http.FileServerFS(assets))
	for _, a := range actions {
		c.mux.HandleFunc("GET /"+a.name, c.confirm(a))
		c.mux.HandleFunc("POST /"+a.name, c.act(a))
	}
}
