package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/dedupkit/dedup/internal/nilcheck"
)

// purgeBatch bounds the rows one purge statement deletes, so purging a large
// backlog never holds many row locks or one long transaction.
const purgeBatch = 1000

// Stats counts an outbox's events by state.
type Stats struct {
	Pending, Failed, Sent int64
	// OldestPending is the age of the oldest event not yet published.
	OldestPending time.Duration
}

// Stats returns the outbox's events counted by state and the age of its
// oldest pending event. It reads the whole table: an operator's query.
func (o *Outbox) Stats(ctx context.Context, db DB) (Stats, error) {
	if nilcheck.IsNil(db) {
		return Stats{}, fmt.Errorf("%w: nil DB", errConfig)
	}
	rows, err := db.Query(ctx, o.sql.stats)
	if err != nil {
		return Stats{}, o.notMigrated(fmt.Errorf("outbox: stats: %w", err))
	}
	defer rows.Close()
	var st Stats
	var age float64
	if rows.Next() {
		if err := rows.Scan(&st.Pending, &st.Failed, &st.Sent, &age); err != nil {
			return Stats{}, fmt.Errorf("outbox: stats: %w", err)
		}
	}
	if err := rows.Err(); err != nil {
		return Stats{}, o.notMigrated(fmt.Errorf("outbox: stats: %w", err))
	}
	st.OldestPending = time.Duration(age * float64(time.Second))
	return st, nil
}

// FailedEvent is an event the relay gave up on: its last error says why.
type FailedEvent struct {
	ID          string
	Destination string
	Key         []byte
	Attempts    int
	LastError   string
	CreatedAt   time.Time
	FailedAt    time.Time
}

// Failed returns up to limit failed events, oldest first.
func (o *Outbox) Failed(ctx context.Context, db DB, limit int) ([]FailedEvent, error) {
	if nilcheck.IsNil(db) {
		return nil, fmt.Errorf("%w: nil DB", errConfig)
	}
	rows, err := db.Query(ctx, o.sql.failed, limit)
	if err != nil {
		return nil, o.notMigrated(fmt.Errorf("outbox: list failed: %w", err))
	}
	defer rows.Close()
	var out []FailedEvent
	for rows.Next() {
		var f FailedEvent
		if err := rows.Scan(&f.ID, &f.Destination, &f.Key, &f.Attempts, &f.LastError, &f.CreatedAt, &f.FailedAt); err != nil {
			return nil, fmt.Errorf("outbox: list failed: %w", err)
		}
		out = append(out, f)
	}
	if err := rows.Err(); err != nil {
		return nil, o.notMigrated(fmt.Errorf("outbox: list failed: %w", err))
	}
	return out, nil
}

// Requeue makes the named failed events pending again, with their attempts
// reset, and returns how many it requeued; IDs of events that are not failed
// are ignored. A requeued event keeps its place in its key's order: it is
// published before the events of its key still pending, and after those
// already sent while it was failed.
func (o *Outbox) Requeue(ctx context.Context, db DB, ids ...string) (int64, error) {
	if nilcheck.IsNil(db) {
		return 0, fmt.Errorf("%w: nil DB", errConfig)
	}
	tag, err := db.Exec(ctx, o.sql.requeue, ids)
	if err != nil {
		return 0, o.notMigrated(fmt.Errorf("outbox: requeue: %w", err))
	}
	if tag.RowsAffected() > 0 {
		_, _ = db.Exec(ctx, o.sql.notify, o.channel)
	}
	return tag.RowsAffected(), nil
}

// States returns the state ("pending", "failed" or "sent") of each of the
// named events that exists, keyed by event ID.
func (o *Outbox) States(ctx context.Context, db DB, ids ...string) (map[string]string, error) {
	if nilcheck.IsNil(db) {
		return nil, fmt.Errorf("%w: nil DB", errConfig)
	}
	states := make(map[string]string, len(ids))
	if len(ids) == 0 {
		return states, nil
	}
	rows, err := db.Query(ctx, o.sql.states, ids)
	if err != nil {
		return nil, o.notMigrated(fmt.Errorf("outbox: states: %w", err))
	}
	defer rows.Close()
	for rows.Next() {
		var id, state string
		if err := rows.Scan(&id, &state); err != nil {
			return nil, fmt.Errorf("outbox: states: %w", err)
		}
		states[id] = state
	}
	if err := rows.Err(); err != nil {
		return nil, o.notMigrated(fmt.Errorf("outbox: states: %w", err))
	}
	return states, nil
}

// Purge deletes the events sent more than olderThan ago, in statements of at
// most 1,000 rows each, and returns how many it deleted. A relay purges by
// itself (see [WithRetention]).
func (o *Outbox) Purge(ctx context.Context, db DB, olderThan time.Duration) (int64, error) {
	if nilcheck.IsNil(db) {
		return 0, fmt.Errorf("%w: nil DB", errConfig)
	}
	var total int64
	for {
		tag, err := db.Exec(ctx, o.sql.purge, olderThan.Milliseconds(), purgeBatch)
		if err != nil {
			return total, o.notMigrated(fmt.Errorf("outbox: purge: %w", err))
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < purgeBatch {
			return total, nil
		}
	}
}
