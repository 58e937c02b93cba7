package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// TxHandler handles one message inside the PostgreSQL transaction that also
// records it as processed: whatever the handler writes through tx commits or
// vanishes together with the dedup record.
//
// The handler must neither commit nor roll back tx: the wrapper commits it
// with the record after a success, and after a failure rolls the handler's
// writes back to a savepoint and records the failure in it. To undo part of
// its own work, a handler nests a transaction (tx.Begin, a savepoint). A
// handler that ends tx itself makes Handle return an error that says so.
type TxHandler[M any] func(ctx context.Context, tx pgx.Tx, msg M) error

// WrapTx returns a Wrapper running the transactional inbox, the strongest
// mode: for each delivery it begins a transaction on the store's pool,
// inserts the record as succeeded, runs h with that transaction and commits.
// The handler's effect and the dedup record commit together, so the effect
// happens exactly once. A concurrent duplicate waits on the record's row
// until the first transaction ends. A failed attempt rolls back the
// handler's writes to a savepoint taken after the claim and records the
// failure in the same transaction, so that the attempt is counted before
// the row is let go. Use it when the handler's effects live in the same
// database.
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
	w.steps = inboxSteps[M]{store: store, handler: h, ttl: w.cfg.ttl}
	return w, nil
}

// inboxSteps are the steps of an attempt in the transactional inbox: the
// claim is made in a transaction that stays open, holding the record's row,
// until the attempt is committed or its failure recorded in it.
type inboxSteps[M any] struct {
	store   *PostgresStore
	handler TxHandler[M]
	ttl     time.Duration
}

func (s inboxSteps[M]) claim(ctx context.Context, d *delivery[M]) (Claim, error) {
	tx, err := s.store.pool.Begin(ctx)
	if err != nil {
		return Claim{}, fmt.Errorf("dedup: inbox begin %s: %w", d.key, err)
	}
	c, err := s.store.claimInTx(ctx, tx, d.request(s.ttl))
	if err != nil || c.Status != ClaimAcquired {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return c, err
	}
	d.tx = tx
	return c, nil
}

func (s inboxSteps[M]) leased() bool { return false }

func (s inboxSteps[M]) run(ctx context.Context, d *delivery[M]) error {
	if !d.sharedTx {
		return s.handler(ctx, d.tx, d.msg)
	}
	tx := &batchTx{Tx: d.tx, savepoint: s.store.sql.savepoint}
	defer func() { d.savepoint = tx.taken }() // a panic too must roll back what it wrote
	err := s.handler(ctx, tx, d.msg)
	if err != nil {
		return err
	}
	if d.tx.Conn().PgConn().TxStatus() == 'E' {
		// Its writes must not be committed as if it had succeeded.
		return errTxAborted
	}
	return nil
}

// errTxAborted is the failure of a batched inbox handler that returned nil
// after a statement of its transaction failed.
var errTxAborted = errors.New("dedup: the TxHandler returned nil after a statement of its transaction failed; its writes are rolled back")

func (s inboxSteps[M]) hold(context.Context, *delivery[M]) error { return nil }

func (s inboxSteps[M]) complete(ctx context.Context, d *delivery[M]) error {
	if d.sharedTx {
		return nil // the claim wrote the record as succeeded: the batch commits it
	}
	tx := d.tx
	d.tx = nil
	if err := tx.Commit(ctx); err != nil {
		if errors.Is(err, pgx.ErrTxClosed) {
			err = fmt.Errorf("the TxHandler committed or rolled back the transaction itself; it must do neither: %w", err)
		}
		// The transaction is gone either way: committing again cannot help.
		return unrepeatable{fmt.Errorf("dedup: inbox commit %s: %w", d.key, err)}
	}
	return nil
}

// fail records the failure in the attempt's transaction while it holds the
// row. When that transaction is lost first (its connection broke), the
// claim's attempt went with it, and the failure is counted by a write of its
// own.
func (s inboxSteps[M]) fail(ctx context.Context, d *delivery[M], f Failure) (int, error) {
	if d.sharedTx {
		attempts, err := s.store.failInBatchTx(ctx, d.tx, d.key, f, d.savepoint)
		if err != nil {
			// The batch's transaction is broken: it ends, and with it
			// the whole batch.
			return 0, unrepeatable{err}
		}
		return attempts, nil
	}
	if tx := d.tx; tx != nil {
		d.tx = nil
		attempts, err := s.store.failInTx(ctx, tx, d.key, f)
		if err == nil {
			return attempts, nil
		}
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return 0, err
	}
	attempts, err := s.store.recordFailure(ctx, d.request(s.ttl), f)
	if errors.Is(err, ErrLeaseLost) {
		// Another delivery settled the event once this one let go of it.
		return 0, unrepeatable{err}
	}
	return attempts, err
}

func (s inboxSteps[M]) end(ctx context.Context, d *delivery[M]) {
	if d.sharedTx {
		d.tx, d.sharedTx, d.savepoint = nil, false, false
		return
	}
	if d.tx != nil {
		_ = d.tx.Rollback(context.WithoutCancel(ctx))
		d.tx = nil
	}
}
