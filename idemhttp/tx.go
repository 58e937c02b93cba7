package idemhttp

import (
	"context"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/nilcheck"
	"github.com/dedupkit/dedup/internal/txguard"
)

// TxHandlerFunc handles a request inside the PostgreSQL transaction that
// holds its key: what it writes through tx commits together with its stored
// response, or not at all.
//
// The middleware ends tx, so the handler must neither commit nor roll it
// back: both return [ErrTxOwned] and change nothing, and the request is then
// answered 500 handler-ended-transaction, nothing applied, the key left
// retryable. To undo part of its own work, a handler nests a transaction
// (tx.Begin, a savepoint), as under dedup.WrapTx.
type TxHandlerFunc func(w http.ResponseWriter, r *http.Request, tx pgx.Tx)

// ErrTxOwned is dedup.ErrTxOwned, returned to a [TxHandlerFunc] that
// commits or rolls back its transaction: the middleware commits it with the
// stored response.
var ErrTxOwned = dedup.ErrTxOwned

// TxBeginner begins transactions; *pgxpool.Pool is one. It must reach the
// database of the store's table.
type TxBeginner = dedup.TxBeginner

// TxMiddleware is the transactional mode on PostgreSQL: for each request
// with a key it begins a transaction, claims the key in it, runs the handler
// with it, stores the response in it and commits. The handler's rows and the
// stored response commit or vanish together, so the effect happens once even
// if the server dies between the handler's write and its answer: the
// transaction rolls back and the retry runs it afresh.
//
// A concurrent request with the same key waits on the key's row until the
// first transaction ends, then replays its answer (commit) or runs
// (rollback). Each waiter holds a pooled connection; to bound the wait, give
// the pool a lock_timeout (pgxpool.Config.ConnConfig.RuntimeParams
// ["lock_timeout"] = "2s"): a waiter past it is answered as in flight (409
// with Retry-After, or 202 with WithInFlightAccepted).
// Answers that are not stored (5xx, other 4xx) roll the transaction back. A
// response over the snapshot limit cannot be stored, so it rolls back too and
// the client gets a 500 problem instead. Streaming is not possible: the
// answer is sent after the commit.
//
// A statement of the handler that fails aborts the transaction. A final 4xx
// answered after that is stored all the same, without the handler's writes
// (rolled back to just after the claim); a 2xx is not, as the writes it
// reports cannot commit: the transaction rolls back and the client gets a
// 500 transaction-aborted problem, the key left retryable.
type TxMiddleware struct {
	front
	db TxBeginner // for requests without a key
}

// NewTx returns a TxMiddleware over store, beginning its transactions on db.
// Its options are those of [New] but two it refuses with [dedup.ErrConfig]:
// WithLease (the row lock is the lease) and WithWaitInFlight (a retry waits
// on the row lock already).
//
// Every request holds one of db's connections from its claim until its
// answer commits, the handler's whole run included, and a retry waiting on
// its key holds another: size the pool (pgxpool.Config.MaxConns) for the
// requests served at once. The handler should query through the tx it is
// given only: one that takes a second connection from the same pool while
// holding the first can exhaust the pool, every request then waiting for a
// connection held by another.
func NewTx(store *dedup.PostgresStore, db TxBeginner, opts ...Opt) (*TxMiddleware, error) {
	if nilcheck.IsNil(store) || nilcheck.IsNil(db) {
		return nil, fmt.Errorf("%w: idemhttp: nil store or database", dedup.ErrConfig)
	}
	f, err := newFront(opts)
	if err != nil {
		return nil, err
	}
	if err := f.cfg.refuseNewOnly(); err != nil {
		return nil, err
	}
	if f.core, err = dedup.NewTxFront(store, db, serveTx, f.coreOpts()...); err != nil {
		return nil, err
	}
	return &TxMiddleware{front: f, db: db}, nil
}

// Wrap returns h as an http.Handler behind the middleware. A request that
// has no key and may go without one (WithOptionalKey) still runs in a
// transaction of its own, committed when it answers 2xx or 3xx; the snapshot
// limit bounds its answer too, as every answer is sent after the commit. It panics if h is nil.
func (m *TxMiddleware) Wrap(h TxHandlerFunc) http.Handler {
	if h == nil {
		panic("idemhttp: Wrap(nil)")
	}
	return m.tel.instrument(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := m.prepare(w, r)
		if !ok {
			return
		}
		if p == nil {
			m.serveKeyless(w, r, h)
			return
		}
		if !m.ready(w, r, p) { // a replay begins no transaction
			return
		}
		c, att, err := m.core.Claim(r.Context(), p.key, p.fingerprint)
		switch {
		case err != nil:
			m.storeError(w, p, "claim", err)
		case att == nil:
			m.answerClaim(w, r, p, c)
		default:
			p.expires = c.Record.ExpiresAt
			x := &p.x
			*x = exchange{r: r, rec: newRecorder(m.recorders, w, m.cfg.maxSnapshot, false), txh: h}
			m.attempt(w, p, att, x)
			x.rec.release(m.recorders)
		}
	}))
}

// serveKeyless serves a request without a key in a plain transaction,
// committed when it answers 2xx or 3xx.
func (m *TxMiddleware) serveKeyless(w http.ResponseWriter, r *http.Request, h TxHandlerFunc) {
	ctx := r.Context()
	tx, err := m.db.Begin(ctx)
	if err != nil {
		m.storeError(w, nil, "begin", err)
		return
	}
	// Rolling back after a commit is a no-op; this covers every early return.
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	htx := &txguard.Tx{Tx: tx, Owned: ErrTxOwned}
	rec := newRecorder(m.recorders, w, m.cfg.maxSnapshot, false)
	defer rec.release(m.recorders)
	h(rec, r, htx) // a panic goes on up, the transaction rolled back by the deferred Rollback
	ended := endedCause(ctx)
	switch {
	case rec.over:
		m.answerOverLimit(w, nil)
		return
	case htx.Ended():
		m.answerTxEnded(w, nil)
		return
	}
	if rec.status < 400 && (rec.wrote || ended == nil) {
		if txguard.Aborted(tx) { // none of its writes can commit
			m.answerTxAborted(w, nil, rec.status)
			return
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.lease)
		defer cancel()
		if err := tx.Commit(sctx); err != nil {
			m.storeError(w, nil, "commit", err)
			return
		}
	}
	m.answer(ended, w, rec)
}
