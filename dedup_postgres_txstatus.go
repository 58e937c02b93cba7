package dedup

import "github.com/jackc/pgx/v5"

// txStatus returns the status of tx's connection as of its last
// ReadyForQuery, read without a round trip: 'T' inside a transaction, 'E'
// inside one a failed statement aborted, 'I' once it ended, and 0 when the
// connection is gone.
func txStatus(tx pgx.Tx) byte {
	conn := tx.Conn()
	if conn == nil || conn.IsClosed() {
		return 0
	}
	return conn.PgConn().TxStatus()
}
