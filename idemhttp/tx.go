package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// lockNotAvailable is PostgreSQL's SQLSTATE for a lock_timeout that ran out.
const lockNotAvailable = "55P03"

// aborted reports whether a statement that failed has aborted tx, so that
// only a rollback (to a savepoint) can follow. It reads the status of the
// connection's last ReadyForQuery: no round trip.
func aborted(tx pgx.Tx) bool {
	conn := tx.Conn()
	return conn != nil && conn.PgConn().TxStatus() == 'E'
}

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
	store *dedup.PostgresStore
	db    TxBeginner
}

// NewTx returns a TxMiddleware over store, beginning its transactions on db.
// Its options are those of [New]; WithLease does not apply (the row lock is
// the lease).
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
	return &TxMiddleware{front: f, store: store, db: db}, nil
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
		m.serveTx(w, r, h, p)
	}))
}

func (m *TxMiddleware) serveTx(w http.ResponseWriter, r *http.Request, h TxHandlerFunc, p *prepared) {
	ctx := r.Context()
	tx, err := m.db.Begin(ctx)
	if err != nil {
		m.storeError(w, p, "begin", err)
		return
	}
	// Rolling back after a commit is a no-op; this covers every early return.
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck

	var owner string
	if p != nil {
		c, err := claimTx(m.store, ctx, tx, p.claimRequest(m.cfg))
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == lockNotAvailable:
			// The pool's lock_timeout ran out while the first request held
			// the key: it is in flight.
			c.Status = dedup.ClaimInFlight
		case err != nil:
			m.storeError(w, p, "claim", err)
			return
		}
		if c.Status != dedup.ClaimAcquired {
			_ = tx.Rollback(ctx)
			m.answerClaim(w, r, p, c)
			return
		}
		owner = c.Record.Owner
	}
	htx := &txguard.Tx{Tx: tx, Owned: ErrTxOwned}
	rec := newRecorder(w, m.cfg.maxSnapshot, false)
	h(rec, r, htx) // a panic goes on up, the transaction rolled back by the deferred Rollback
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.lease)
	defer cancel()
	switch {
	case rec.over:
		_ = tx.Rollback(sctx)
		m.cfg.logger.Warn("idemhttp: response over the snapshot limit; transaction rolled back",
			slog.Int("limit", m.cfg.maxSnapshot))
		m.cfg.writeProblem(w, ProblemTooLarge, http.StatusInternalServerError,
			fmt.Sprintf("the answer is over the %d bytes a stored response may hold (WithMaxSnapshotBytes), so the operation was not applied; "+
				"every retry of it will get this answer until the limit is raised", m.cfg.maxSnapshot), 0)
		return
	case htx.Ended():
		_ = tx.Rollback(sctx)
		m.cfg.logger.Error("idemhttp: the handler committed or rolled back its transaction, which the middleware ends; rolled back, not stored",
			slog.String("key", keyName(p)))
		m.cfg.writeProblem(w, ProblemTxEnded, http.StatusInternalServerError,
			"the handler tried to end the transaction the middleware commits, so the operation was not applied", 0)
		return
	}
	ended := endedCause(ctx)
	store := p != nil && m.storable(ended, rec)
	commit := store || (p == nil && rec.status < 400 && (rec.wrote || ended == nil))
	if commit && aborted(tx) {
		// A statement of the handler failed: none of its writes can
		// commit. A final 4xx stands without them; a success does not.
		if !store || rec.status < 400 || rollbackToClaimTx(m.store, sctx, tx) != nil {
			_ = tx.Rollback(sctx)
			m.cfg.logger.Error("idemhttp: handler answered after a failed statement aborted its transaction; rolled back, not stored",
				slog.String("key", keyName(p)), slog.Int("status", rec.status))
			m.cfg.writeProblem(w, ProblemTxAborted, http.StatusInternalServerError,
				"a statement of the handler failed, so the operation was not applied; retry with the same key", 0)
			return
		}
	}
	if !store {
		if commit {
			if err := tx.Commit(sctx); err != nil {
				m.storeError(w, p, "commit", err)
				return
			}
		}
		_ = tx.Rollback(sctx)
		m.answer(ended, w, rec)
		return
	}
	snap, err := encodeSnapshot(rec.status, rec.header, m.cfg.storedHeaders, rec.body.Bytes())
	if err != nil {
		_ = tx.Rollback(sctx)
		m.cfg.logger.Warn("idemhttp: response's headers could not be replayed; transaction rolled back",
			slog.String("key", p.key.String()), slog.Any("error", err))
		m.cfg.writeProblem(w, ProblemUnstorable, http.StatusInternalServerError,
			"the answer's headers cannot be stored for replay, so the operation was not applied", 0)
		return
	}
	if err := completeTx(m.store, sctx, tx, p.key, owner, snap); err != nil {
		m.storeError(w, p, "complete", err)
		return
	}
	if err := tx.Commit(sctx); err != nil {
		// Either nothing committed (a retry runs afresh) or the commit's
		// answer was lost (a retry replays): retrying is right both ways.
		m.storeError(w, p, "commit", err)
		return
	}
	rec.flush()
}
