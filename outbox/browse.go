package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dedupkit/dedup/internal/nilcheck"
)

// DestinationBacklog is what waits to be published to one destination.
type DestinationBacklog struct {
	Destination string
	Pending     int64
	// OldestPending is the age of the destination's oldest pending event.
	OldestPending time.Duration
}

// PublishedMinute counts the events marked sent in one minute.
type PublishedMinute struct {
	Minute time.Time
	Count  int64
}

// Backlog returns the pending events counted by destination, in
// destination order, with the age of each one's oldest. It reads the
// pending events alone, through the relay's index of them, for the
// operator's console (package dedupui).
func (o *Outbox) Backlog(ctx context.Context, db DB) ([]DestinationBacklog, error) {
	if nilcheck.IsNil(db) {
		return nil, fmt.Errorf("%w: nil DB", errConfig)
	}
	rows, err := db.Query(ctx, `SELECT destination, count(*), extract(epoch FROM now() - min(created_at))::float8
		FROM `+o.table+` WHERE status = 'pending' GROUP BY destination ORDER BY destination`)
	if err != nil {
		return nil, o.notMigrated(fmt.Errorf("outbox: backlog: %w", err))
	}
	var out []DestinationBacklog
	var b DestinationBacklog
	var age float64
	_, err = pgx.ForEachRow(rows, []any{&b.Destination, &b.Pending, &age}, func() error {
		b.OldestPending = time.Duration(age * float64(time.Second))
		out = append(out, b)
		return nil
	})
	if err != nil {
		return nil, o.notMigrated(fmt.Errorf("outbox: backlog: %w", err))
	}
	return out, nil
}

// Published counts the events marked sent in each minute of the window
// before now, oldest first, through the index of sent events. A relay that
// deletes what it sent (WithDeleteSent) leaves nothing to count.
func (o *Outbox) Published(ctx context.Context, db DB, window time.Duration) ([]PublishedMinute, error) {
	if nilcheck.IsNil(db) {
		return nil, fmt.Errorf("%w: nil DB", errConfig)
	}
	rows, err := db.Query(ctx, `SELECT date_trunc('minute', sent_at), count(*) FROM `+o.table+`
		WHERE status = 'sent' AND sent_at > now() - $1 * interval '1 millisecond' GROUP BY 1 ORDER BY 1`, window.Milliseconds())
	if err != nil {
		return nil, o.notMigrated(fmt.Errorf("outbox: published: %w", err))
	}
	var out []PublishedMinute
	var m PublishedMinute
	_, err = pgx.ForEachRow(rows, []any{&m.Minute, &m.Count}, func() error {
		out = append(out, m)
		return nil
	})
	if err != nil {
		return nil, o.notMigrated(fmt.Errorf("outbox: published: %w", err))
	}
	return out, nil
}
