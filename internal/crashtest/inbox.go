package crashtest

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrPoison is what a worker's handler returns for a poison event.
var ErrPoison = errors.New("poison: this event can never succeed")

// InboxPools opens a transactional inbox worker's two pools on dsn, one for
// the records' transactions and one for the start rows written beside them
// (a handler waiting for a connection that its own batch's transactions
// hold would wait forever), and returns them with a func closing both.
func InboxPools(ctx context.Context, dsn string) (records, starts *pgxpool.Pool, closePools func(), err error) {
	records, err = pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, nil, nil, err
	}
	starts, err = pgxpool.New(ctx, dsn)
	if err != nil {
		records.Close()
		return nil, nil, nil, err
	}
	return records, starts, func() {
		starts.Close()
		records.Close()
	}, nil
}

// InboxHandler returns a transactional inbox handler (dedup.TxHandler)
// that records a start row of the message's event in table through starts,
// works a little, then, unless the payload marks the event poison, writes
// its effect row in the record's transaction and works a little more, so
// that a kill lands before the effect, between effect and commit, or
// elsewhere; read returns the message's event ID and payload.
func InboxHandler[M any](starts *pgxpool.Pool, table, worker string, read func(M) (id string, payload []byte, err error)) func(context.Context, pgx.Tx, M) error {
	insert := `INSERT INTO ` + table + ` (event_id, worker, kind) VALUES ($1, $2, $3)`
	return func(ctx context.Context, tx pgx.Tx, m M) error {
		id, payload, err := read(m)
		if err != nil {
			return err
		}
		if _, err := starts.Exec(ctx, insert, id, worker, "start"); err != nil {
			return err
		}
		if err := Pause(ctx, 20*time.Millisecond); err != nil {
			return err
		}
		if strings.Contains(string(payload), `"poison":true`) {
			return ErrPoison
		}
		if _, err := tx.Exec(ctx, insert, id, worker, "effect"); err != nil {
			return err
		}
		return Pause(ctx, 10*time.Millisecond)
	}
}
