package dedup

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Stuck implements [Admin]. It scans the table: it is an operator's query,
// not one for a hot path.
func (s *PostgresStore) Stuck(ctx context.Context, scope string, olderThan time.Duration, limit int) ([]Record, error) {
	rows, err := s.pool.Query(ctx, `SELECT scope, event_id, `+recordColumns+` FROM `+s.table+`
WHERE ($1 = '' OR scope = $1) AND expires_at > now()
	AND ((status = 'PROCESSING' AND lease_until < now())
		OR (status = 'FAILED_RETRYABLE' AND updated_at < now() - $2::interval))
ORDER BY updated_at LIMIT $3`, scope, olderThan, limit)
	if err != nil {
		return nil, s.opError("stuck", err)
	}
	var out []Record
	var r pgRecord
	var key Key
	_, err = pgx.ForEachRow(rows, r.targets(&key.Scope, &key.EventID), func() error {
		rec, err := r.decode(key)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		out = append(out, rec)
		r = pgRecord{}
		return nil
	})
	if err != nil {
		return nil, s.opError("stuck", scanError(err))
	}
	return out, nil
}

// Forget implements [Admin].
func (s *PostgresStore) Forget(ctx context.Context, key Key, owner string) (bool, error) {
	if err := key.Validate(); err != nil {
		return false, fmt.Errorf("dedup: postgres forget: %w", err)
	}
	tag, err := s.pool.Exec(ctx, `DELETE FROM `+s.table+`
WHERE scope = $1 AND event_id = $2 AND owner = $3 AND status <> 'SUCCEEDED'`, key.Scope, key.EventID, owner)
	if err != nil {
		return false, s.opError("forget "+key.String(), err)
	}
	return tag.RowsAffected() == 1, nil
}
