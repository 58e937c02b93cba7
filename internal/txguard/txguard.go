// Package txguard is the transaction dedup hands a handler and ends itself
// (a batch's shared transaction of the inbox, idemhttp's transactional
// mode): the handler may use it, but not end it.
package txguard

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Tx is a transaction a handler may use but not end: Commit and Rollback
// return Owned and change nothing. It notes whether the handler used it
// and whether it tried to end it.
type Tx struct {
	pgx.Tx
	// Owned is the error Commit and Rollback return (dedup.ErrTxOwned).
	Owned error
	used  bool
	ended atomic.Bool
}

// Used reports whether the handler sent anything through the transaction.
func (t *Tx) Used() bool { return t.used }

// Ended reports whether the handler called Commit or Rollback.
func (t *Tx) Ended() bool { return t.ended.Load() }

// Commit refuses: the transaction is not the handler's to end.
func (t *Tx) Commit(context.Context) error {
	t.ended.Store(true)
	return t.Owned
}

// Rollback refuses: the transaction is not the handler's to end.
func (t *Tx) Rollback(context.Context) error {
	t.ended.Store(true)
	return t.Owned
}

func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	t.used = true
	return t.Tx.Exec(ctx, sql, args...)
}

func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	t.used = true
	return t.Tx.QueryRow(ctx, sql, args...)
}

func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	t.used = true
	return t.Tx.Query(ctx, sql, args...)
}

func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	t.used = true
	return t.Tx.SendBatch(ctx, b)
}

func (t *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	t.used = true
	return t.Tx.CopyFrom(ctx, table, columns, src)
}

func (t *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	t.used = true
	return t.Tx.Prepare(ctx, name, sql)
}

func (t *Tx) Begin(ctx context.Context) (pgx.Tx, error) {
	t.used = true
	return t.Tx.Begin(ctx)
}

func (t *Tx) LargeObjects() pgx.LargeObjects {
	t.used = true
	return t.Tx.LargeObjects()
}

func (t *Tx) Conn() *pgx.Conn {
	t.used = true
	return t.Tx.Conn()
}

// Status returns the status of tx's connection as of its last
// ReadyForQuery, read without a round trip: 'T' inside a transaction, 'E'
// inside one a failed statement aborted, 'I' once it ended, and 0 when the
// connection is gone.
func Status(tx pgx.Tx) byte {
	conn := tx.Conn()
	if conn == nil || conn.IsClosed() {
		return 0
	}
	return conn.PgConn().TxStatus()
}

// Aborted reports whether a failed statement aborted tx: nothing it wrote
// can commit.
func Aborted(tx pgx.Tx) bool { return Status(tx) == 'E' }
