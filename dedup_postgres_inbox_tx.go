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

// batchTx is a batch's shared transaction as one of its handlers sees it.
// Before the handler's first statement it takes the savepoint a failure of
// the handler rolls back to, sent in the same round trip as an Exec or a
// QueryRow: a handler that writes once pays no round trip for it, and one
// that does not write takes none.
type batchTx struct {
	pgx.Tx
	savepoint string // the SQL
	taken     bool
}

func (*batchTx) Commit(context.Context) error   { return ErrTxOwned }
func (*batchTx) Rollback(context.Context) error { return ErrTxOwned }

// take takes the savepoint on its own, before a statement it cannot share a
// round trip with.
func (t *batchTx) take(ctx context.Context) error {
	if t.taken {
		return nil
	}
	t.taken = true
	_, err := t.Tx.Exec(ctx, t.savepoint)
	return err
}

// first sends the savepoint and sql in one batch and returns the results,
// the savepoint's already read; ok is false when sql must go on its own (a
// statement without arguments may be several, which a batch cannot hold).
func (t *batchTx) first(ctx context.Context, sql string, args []any) (br pgx.BatchResults, ok bool, err error) {
	if t.taken || len(args) == 0 {
		return nil, false, t.take(ctx)
	}
	t.taken = true
	var b pgx.Batch
	b.Queue(t.savepoint)
	b.Queue(sql, args...)
	br = t.Tx.SendBatch(ctx, &b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, false, err
	}
	return br, true, nil
}

func (t *batchTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	br, ok, err := t.first(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	if !ok {
		return t.Tx.Exec(ctx, sql, args...)
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

func (t *batchTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	br, ok, err := t.first(ctx, sql, args)
	if err != nil {
		return errRow{err}
	}
	if !ok {
		return t.Tx.QueryRow(ctx, sql, args...)
	}
	return batchRow{br: br, row: br.QueryRow()}
}

func (t *batchTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.take(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Query(ctx, sql, args...)
}

func (t *batchTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	_ = t.take(ctx) // a failure leaves the transaction failed: the batch's results say so
	return t.Tx.SendBatch(ctx, b)
}

func (t *batchTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.take(ctx); err != nil {
		return 0, err
	}
	return t.Tx.CopyFrom(ctx, table, columns, src)
}

func (t *batchTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.take(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Prepare(ctx, name, sql)
}

func (t *batchTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.take(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Begin(ctx)
}

func (t *batchTx) LargeObjects() pgx.LargeObjects {
	_ = t.take(context.Background()) // a failure shows at the handler's next statement
	return t.Tx.LargeObjects()
}

func (t *batchTx) Conn() *pgx.Conn {
	_ = t.take(context.Background()) // what the handler runs on the connection follows the savepoint
	return t.Tx.Conn()
}

// batchRow is the row of a QueryRow sent with the savepoint: reading it
// ends the batch.
type batchRow struct {
	br  pgx.BatchResults
	row pgx.Row
}

func (r batchRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
