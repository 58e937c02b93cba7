package dedup

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/dedupkit/dedup/internal/nilcheck"
)

// TxBeginner begins transactions; *pgxpool.Pool is one.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// NewTxFront returns a Front whose attempts are the transactional inbox's
// (see [WrapTx]): each claim begins a transaction on db, which must reach
// the database of store's table, and records the key in it as succeeded;
// [Attempt.Run] runs h with that transaction; [Attempt.Complete] writes the
// result on the record in it and commits, so that h's writes and the
// result commit together; [Attempt.Fail] rolls h's writes back to the
// claim and records the failure. The transaction's row lock is the claim's
// lease: a concurrent claim of the key waits for it to end, and one that
// waits past the database's lock_timeout finds the key in flight.
//
// Each attempt holds one of db's connections from its claim until it ends.
// A front end's attempts are not counted in the store's bound on its
// consumers' transactions ([WithTxConns]): on the store's pool, they take
// the connections that bound leaves free.
// Its options are those of [NewFront], refused as it refuses them.
func NewTxFront[M any](store *PostgresStore, db TxBeginner, h TxHandler[M], opts ...Opt) (*Front[M], error) {
	if store == nil || nilcheck.IsNil(db) {
		return nil, fmt.Errorf("%w: NewTxFront: nil store or database", ErrConfig)
	}
	if h == nil {
		return nil, fmt.Errorf("%w: nil handler", ErrConfig)
	}
	f, err := newFront[M](store, opts)
	if err != nil {
		return nil, err
	}
	f.w.claimer = &inbox[M]{w: f.w, store: store, db: db, handler: h, front: true}
	return f, nil
}

// resultInTx stores result on the record of key that a claim in tx acquired,
// after rolling tx back to the claim's savepoint
// when undo is set (a failed statement aborted tx: what it wrote since
// cannot commit). The record keeps the retention its claim gave it. It
// returns ErrLeaseLost when tx holds no such record.
func (s *PostgresStore) resultInTx(ctx context.Context, tx pgx.Tx, key Key, result []byte, undo bool) error {
	if undo {
		if err := s.rollbackToClaim(ctx, tx, key); err != nil {
			return err
		}
	}
	tag, err := tx.Exec(ctx, s.sql.resultInTx, key.Scope, key.EventID, result)
	switch {
	case err != nil:
		return s.opError("complete in tx "+key.String(), err)
	case tag.RowsAffected() == 0:
		return fmt.Errorf("dedup: postgres complete in tx %s: %w", key, ErrLeaseLost)
	}
	return nil
}
