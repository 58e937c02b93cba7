package dedup

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Stuck implements [Admin]. It scans the table: it is an operator's query,
// not one for a hot path. While a migration from record v1 runs, it sees
// the rows moved so far.
func (s *PostgresStore) Stuck(ctx context.Context, scope string, olderThan time.Duration, limit int) ([]Record, error) {
	rows, err := s.pool.Query(ctx, s.sql.stuck, scope, olderThan, limit)
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
	if err := s.pullKey(ctx, nil, key); err != nil {
		return false, s.opError("forget "+key.String(), err)
	}
	tag, err := s.pool.Exec(ctx, s.sql.forget, key.Scope, key.EventID, pgPack(owner, ownerBytes))
	if err != nil {
		return false, s.opError("forget "+key.String(), err)
	}
	return tag.RowsAffected() == 1, nil
}
