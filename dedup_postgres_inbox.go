package dedup

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TxHandler handles one message inside the PostgreSQL transaction that also
// records it as processed: whatever the handler writes through tx commits or
// vanishes together with the dedup record.
//
// The handler must neither commit nor roll back tx: the wrapper commits it
// with the record after a success, and after a failure undoes the handler's
// writes and records the failure. To undo part of its own work, a handler
// nests a transaction (tx.Begin, a savepoint). A handler that ends tx
// itself makes Handle return an error that says so. A handler that returns
// nil after a statement of tx failed (which aborts tx) has failed all the
// same, with an error matching [ErrTxAborted]: its writes cannot commit.
type TxHandler[M any] func(ctx context.Context, tx pgx.Tx, msg M) error

// WrapTx returns a Wrapper running the transactional inbox, the strongest
// mode: for each delivery it begins a transaction on the store's pool,
// inserts the record as succeeded (four columns: key, fingerprint, expiry;
// see "What the transactional inbox writes" in the package doc), runs h
// with that transaction and commits.
// The handler's effect and the dedup record commit together, so the effect
// happens exactly once. A concurrent duplicate waits on the record's row
// until the first transaction ends. A failed attempt rolls back the
// handler's writes to a savepoint taken after the claim and records the
// failure in the same transaction, so that the attempt is counted before
// the row is let go. HandleBatch runs a batch's events in shared
// transactions (see [WithTxPerEvent]). Use it when the handler's effects
// live in the same database.
//
// Each event in flight holds one of the pool's connections for its
// transaction, but the store's wrappers together hold no more than its
// bound ([WithTxConns]; by default the pool's MaxConns less a quarter, at
// least one left): the events beyond it (HandleConcurrent's, a prefetch's)
// wait for a transaction to end, and the rest of the pool stays free for
// everything else on it, an API, a handler's own queries outside tx. WrapTx
// logs at WARN when the bound leaves nothing beside the inbox.
func WrapTx[M any](store *PostgresStore, msgs Messages[M], h TxHandler[M], opts ...Opt) (*Wrapper[M], error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrConfig)
	}
	w, err := newWrapper[M](store, msgs, opts)
	if err != nil {
		return nil, err
	}
	if h == nil {
		return nil, fmt.Errorf("%w: nil handler", ErrConfig)
	}
	if w.cfg.batchWaitSet && w.cfg.batchWait > 0 {
		return nil, fmt.Errorf("%w: WithBatchCompletion: WrapTx records each event in its handler's transaction", ErrConfig)
	}
	store.txConns.warnNoReserve(w.cfg.logger)
	in := &inbox[M]{w: w, store: store, db: store.txConns, handler: h}
	w.claimer, w.runner = in, in.newChunk
	if w.cfg.txPerEvent {
		w.runner = newEachRunner[M]
	}
	return w, nil
}

// inbox claims an event of the transactional inbox in a transaction of its
// own, which stays open, holding the record's row, until the attempt is
// committed or its failure recorded in it.
type inbox[M any] struct {
	w     *Wrapper[M]
	store *PostgresStore
	// db begins the attempts' transactions: the store's pool within its
	// bound (txBudget), or the database a front end was given (NewTxFront).
	db      TxBeginner
	handler TxHandler[M]
	// front is set for a Front's attempts (NewTxFront): the front end
	// judges the handler's answer after it ran, so a transaction a failed
	// statement aborted is judged at completion, by whether the result
	// stands without its writes (see txAttempt.complete).
	front bool
}

func (in *inbox[M]) claim(ctx context.Context, req ClaimRequest) (Claim, attempt[M], error) {
	return in.claimRequest(ctx, req, nil)
}

// claimWith claims d's key in a transaction of its own for an attempt whose
// handler, when verdict is set, already failed with it and does not run
// again.
func (in *inbox[M]) claimWith(ctx context.Context, d *delivery[M], verdict error) (Claim, attempt[M], error) {
	return in.claimRequest(ctx, d.request(in.w.cfg.ttl), verdict)
}

// claimRequest claims req's key as claimWith does. A claim that waited on
// the key's row for longer than the database's lock_timeout finds it in
// flight.
func (in *inbox[M]) claimRequest(ctx context.Context, req ClaimRequest, verdict error) (Claim, attempt[M], error) {
	tx, err := in.db.Begin(ctx)
	if err != nil {
		return Claim{}, nil, fmt.Errorf("dedup: inbox begin %s: %w", req.Key, err)
	}
	c, err := in.store.claimInTx(ctx, tx, req)
	if err != nil || c.Status != ClaimAcquired {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		if err != nil && lockTimedOut(err) {
			return Claim{Status: ClaimInFlight, Record: Record{Key: req.Key, Status: StatusProcessing}}, nil, nil
		}
		return c, nil, err
	}
	return c, &txAttempt[M]{in: in, tx: tx, verdict: verdict}, nil
}

// lockTimedOut reports whether err is PostgreSQL's lock_not_available: a
// lock_timeout ran out while another transaction held the row.
func lockTimedOut(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// txAttempt is an attempt of the inbox in a transaction of its own. Its row
// lock is its lease: nobody takes the event over while tx is open.
type txAttempt[M any] struct {
	in *inbox[M]
	tx pgx.Tx // nil once committed or rolled back
	// verdict, when set, is the failure of this attempt's handler in a
	// batch's transaction that was rolled back: it does not run again.
	verdict error
}

func (a *txAttempt[M]) run(ctx context.Context, d *delivery[M]) (err error) {
	if a.verdict != nil {
		return a.verdict
	}
	defer capturePanic(&err)
	if err = a.in.handler(ctx, a.tx, d.msg); err == nil && !a.in.front {
		err = abortedRun(a.tx)
	}
	return err
}

// errAbortedRun is the failure of a TxHandler that returned nil, or of a
// front end's that answered a success, after a statement of its
// transaction failed: its writes cannot commit as if it had succeeded, and
// are rolled back.
var errAbortedRun error = handlerFault{fmt.Errorf("%w: the handler returned nil after it; its writes are rolled back", ErrTxAborted)}

// abortedRun is the one rule for a handler's nil in an inbox transaction: a
// success only while tx can commit. It returns errAbortedRun when a failed
// statement aborted tx, nil otherwise.
func abortedRun(tx pgx.Tx) error {
	if txStatus(tx) == 'E' {
		return errAbortedRun
	}
	return nil
}

func (a *txAttempt[M]) hold(context.Context, *delivery[M]) error { return nil }

// complete commits the attempt's transaction, with d.result written on its
// record first when there is one. A transaction a failed statement aborted
// cannot commit the handler's writes: when d.result stands without them (a
// front end's refusal) it is recorded alone, the writes rolled back to the
// claim. A front end's success in such a transaction is the handler's
// failure, which run finds for a consumer (abortedRun): it is recorded as
// one, and returned.
func (a *txAttempt[M]) complete(ctx context.Context, d *delivery[M], _ bool) error {
	herr := abortedRun(a.tx)
	if herr != nil && (d.result == nil || !d.result.standalone) {
		if _, err := a.fail(ctx, d, Failure{Error: herr.Error(), TTL: a.in.w.cfg.ttl}, false); err != nil {
			return unrepeatable{fmt.Errorf("dedup: inbox complete %s: %w; recording its failure: %w", d.key, ErrTxAborted, err)}
		}
		return unrepeatable{fmt.Errorf("dedup: inbox complete %s: %w", d.key, herr)}
	}
	tx := a.tx
	a.tx = nil
	undo := herr != nil
	if d.result != nil {
		if err := a.in.store.resultInTx(ctx, tx, d.key, d.result.data, undo); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return unrepeatable{sharedFate{err}}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		if errors.Is(err, pgx.ErrTxClosed) {
			err = fmt.Errorf("the TxHandler committed or rolled back the transaction itself; it must do neither: %w", err)
		}
		err = fmt.Errorf("dedup: inbox commit %s: %w", d.key, err)
		if commitFaulted(err) {
			err = handlerFault{err}
		}
		// The transaction is gone either way: committing again cannot help.
		return unrepeatable{sharedFate{err}}
	}
	return nil
}

// commitFaulted reports whether err, a commit's, was caused by the handler:
// it ended the transaction itself, or its writes broke a deferred
// constraint (an integrity_constraint_violation, class 23).
func commitFaulted(err error) bool {
	var pgErr *pgconn.PgError
	return errors.Is(err, pgx.ErrTxClosed) || errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "23")
}

// fail records the failure in the attempt's transaction while it holds the
// row. When that transaction is lost first (its connection broke), the
// claim's attempt went with it, and the failure is counted by a write of its
// own.
func (a *txAttempt[M]) fail(ctx context.Context, d *delivery[M], f Failure, _ bool) (int, error) {
	if tx := a.tx; tx != nil {
		a.tx = nil
		attempts, err := a.in.store.failInTx(ctx, tx, d.key, d.owner, f)
		if err == nil {
			return attempts, nil
		}
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return 0, err
	}
	attempts, err := a.in.store.recordFailure(ctx, d.request(a.in.w.cfg.ttl), f)
	if errors.Is(err, ErrLeaseLost) {
		// Another delivery settled the event once this one let go of it.
		return 0, unrepeatable{err}
	}
	return attempts, err
}

func (a *txAttempt[M]) end(ctx context.Context, _ *delivery[M]) {
	if a.tx != nil {
		_ = a.tx.Rollback(context.WithoutCancel(ctx))
		a.tx = nil
	}
}

func (a *txAttempt[M]) left() bool { return false }
