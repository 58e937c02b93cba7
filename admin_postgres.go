package dedup

import (
	"context"
	"fmt"
	"time"
)

// Stuck implements [Admin]. It scans the table: it is an operator's query,
// not one for a hot path. While a migration from record v1 runs, it sees
// the rows moved so far.
func (s *PostgresStore) Stuck(ctx context.Context, scope string, olderThan time.Duration, limit int) ([]Record, error) {
	return s.records(ctx, "stuck", s.sql.stuck, scope, olderThan, limit)
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
