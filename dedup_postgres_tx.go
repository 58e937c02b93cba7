package dedup

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/dedupkit/dedup/internal/inmodule"
)

func init() {
	inmodule.ClaimTx = (*PostgresStore).claimTx
	inmodule.CompleteTx = (*PostgresStore).completeTx
	inmodule.RollbackToClaimTx = (*PostgresStore).rollbackToClaimTx
}

// claimTx claims req.Key inside the caller's transaction tx, for idemhttp's
// transactional mode (through internal/inmodule). The record is written as
// succeeded at once, as in the transactional inbox ([WrapTx]): it commits or
// vanishes with whatever else tx writes. A concurrent claimTx or Claim of
// the same key waits on the record's row until tx ends, then sees a
// duplicate (commit) or acquires the key (rollback). req.Lease is unused:
// the transaction's row lock is the lease.
//
// Only an acquired claim belongs to tx; the caller then runs its work in tx,
// may store a result with completeTx, and commits. An acquired claim is
// followed by a savepoint, taken in the same round trip, which
// rollbackToClaimTx returns to.
func (s *PostgresStore) claimTx(ctx context.Context, tx pgx.Tx, req ClaimRequest) (Claim, error) {
	if tx == nil {
		return Claim{}, fmt.Errorf("%w: postgres claim in tx: nil transaction", ErrConfig)
	}
	return s.claimInTx(ctx, tx, req)
}

// completeTx stores result on the record that a claimTx in the same tx
// acquired with owner token owner (Claim.Record.Owner); the record keeps the
// retention its claim gave it. It returns ErrLeaseLost when tx holds no such
// record.
func (s *PostgresStore) completeTx(ctx context.Context, tx pgx.Tx, key Key, owner string, result []byte) error {
	if tx == nil {
		return fmt.Errorf("%w: postgres complete in tx: nil transaction", ErrConfig)
	}
	if err := key.Validate(); err != nil {
		return fmt.Errorf("dedup: postgres complete in tx: %w", err)
	}
	tag, err := tx.Exec(ctx, `UPDATE `+s.table+` SET result = $4, updated_at = now()
WHERE scope = $1 AND event_id = $2 AND owner = $3 AND status = 'SUCCEEDED'`,
		key.Scope, key.EventID, owner, result)
	if err != nil {
		return s.opError("complete in tx "+key.String(), err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("dedup: postgres complete in tx %s: %w", key, ErrLeaseLost)
	}
	return nil
}

// rollbackToClaimTx undoes what tx wrote after a claimTx in it acquired its
// claim, keeping the claim, and ends the aborted state a failed statement
// leaves tx in: the caller may then store a result with completeTx and
// commit. Savepoints taken after the claim go with what they held.
func (s *PostgresStore) rollbackToClaimTx(ctx context.Context, tx pgx.Tx) error {
	if tx == nil {
		return fmt.Errorf("%w: postgres rollback to claim in tx: nil transaction", ErrConfig)
	}
	if _, err := tx.Exec(ctx, s.sql.rollbackToSavepoint); err != nil {
		return s.opError("rollback to claim in tx", err)
	}
	return nil
}
