package dedup

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// TxHandler handles one message inside the PostgreSQL transaction that also
// records it as processed: whatever the handler writes through tx commits or
// vanishes together with the dedup record.
type TxHandler[M any] func(ctx context.Context, tx pgx.Tx, msg M) error

// WrapTx returns a Wrapper running the transactional inbox, the strongest
// mode: for each delivery it begins a transaction on the store's pool,
// inserts the record as succeeded, runs h with that transaction and commits.
// The handler's effect and the dedup record commit together, so the effect
// happens exactly once. A concurrent duplicate waits on the record's row
// until the first transaction ends. A failed attempt rolls back and is
// counted by a separate write. Use it when the handler's effects live in the
// same database.
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
	w.inbox = &inbox[M]{store: store, handler: h}
	return w, nil
}

// inbox is what a transactional-inbox wrapper runs instead of store claims.
type inbox[M any] struct {
	store   *PostgresStore
	handler TxHandler[M]
}

func (w *Wrapper[M]) runInTx(ctx context.Context, d *delivery[M]) (Result, error) {
	s, h := w.inbox.store, w.inbox.handler
	req := d.request(w.cfg.ttl)
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return Result{Key: d.key}, fmt.Errorf("dedup: inbox begin %s: %w", d.key, err)
	}
	// Rolling back after a commit is a no-op; this covers every early return.
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck

	c, err := s.claimInTx(ctx, tx, req)
	if err != nil {
		return Result{Key: d.key}, fmt.Errorf("dedup: inbox claim %s: %w", d.key, err)
	}
	fail := func(ctx context.Context, f Failure) error {
		// Not fenced on a token: a refusal means the event was settled.
		return w.settleHeld(ctx, d, "", func(ctx context.Context) error {
			_, err := s.recordFailure(ctx, req, f)
			return err
		})
	}
	switch {
	case c.Status != ClaimAcquired:
		_ = tx.Rollback(ctx)
		return w.settleClaim(ctx, d, c)
	case c.Record.Attempts > w.cfg.maxAttempts:
		// An earlier attempt failed last and its dead letter was not written.
		_ = tx.Rollback(ctx)
		cause := errors.New(orDefault(c.Record.LastError, "attempts exhausted without a recorded error"))
		return w.parkFinal(ctx, d, c.Record, ReasonHandlerError, cause, fail)
	}

	err = callHandler(ctx, func(ctx context.Context, msg M) error { return h(ctx, tx, msg) }, d.msg)
	if err == nil && ctx.Err() != nil {
		w.warnNilAfterCancel(d.key)
	}
	if err == nil {
		sctx, cancel := settleContext(ctx)
		defer cancel()
		if err := tx.Commit(sctx); err != nil {
			return Result{Key: d.key}, fmt.Errorf("dedup: inbox commit %s: %w", d.key, err)
		}
		return Result{Outcome: Processed, Key: d.key, Attempts: c.Record.Attempts}, nil
	}
	sctx, cancel := settleContext(ctx)
	defer cancel()
	_ = tx.Rollback(sctx)
	res, serr := w.afterFailure(sctx, d, c.Record, err, fail)
	if serr == nil && ctx.Err() != nil {
		return res, err
	}
	return res, serr
}
