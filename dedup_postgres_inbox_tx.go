package dedup

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrTxOwned is returned by Commit and Rollback of a transaction dedup gives
// a handler and ends itself: a TxHandler's in a batch (the transaction holds
// the batch's other events too) and idemhttp's transactional handler's (the
// middleware commits it with the stored response).
var ErrTxOwned = errors.New("dedup: the handler must neither commit nor roll back its transaction; dedup ends it")

// handlerTx is a batch's shared transaction as one of its handlers sees it:
// it refuses to be ended, and notes whether the handler used it, so that a
// handler that failed before writing anything costs its batch nothing.
type handlerTx struct {
	pgx.Tx
	used bool
}

func (*handlerTx) Commit(context.Context) error   { return ErrTxOwned }
func (*handlerTx) Rollback(context.Context) error { return ErrTxOwned }

func (t *handlerTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	t.used = true
	return t.Tx.Exec(ctx, sql, args...)
}

func (t *handlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	t.used = true
	return t.Tx.QueryRow(ctx, sql, args...)
}

func (t *handlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	t.used = true
	return t.Tx.Query(ctx, sql, args...)
}

func (t *handlerTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	t.used = true
	return t.Tx.SendBatch(ctx, b)
}

func (t *handlerTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	t.used = true
	return t.Tx.CopyFrom(ctx, table, columns, src)
}

func (t *handlerTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	t.used = true
	return t.Tx.Prepare(ctx, name, sql)
}

func (t *handlerTx) Begin(ctx context.Context) (pgx.Tx, error) {
	t.used = true
	return t.Tx.Begin(ctx)
}

func (t *handlerTx) LargeObjects() pgx.LargeObjects {
	t.used = true
	return t.Tx.LargeObjects()
}

func (t *handlerTx) Conn() *pgx.Conn {
	t.used = true
	return t.Tx.Conn()
}
