package dedup

import (
	"github.com/jackc/pgx/v5"

	"github.com/dedupkit/dedup/internal/txguard"
)

// txStatus returns the status of tx's connection (see txguard.Status): 'T'
// inside a transaction, 'E' inside one a failed statement aborted, 'I' once
// it ended, and 0 when the connection is gone.
func txStatus(tx pgx.Tx) byte { return txguard.Status(tx) }
