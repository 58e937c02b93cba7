package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"github.com/dedupkit/dedup/internal/nilcheck"
)

// Add writes events in tx, the caller's transaction (begun on a *pgx.Conn or
// a *pgxpool.Pool): they are published if and only if tx commits. It returns
// the events' IDs, generating a UUIDv7 for each event without one. An event
// that cannot be written is reported as an *EventError (ErrInvalidEvent)
// before anything is written; an ID already in the table as ErrDuplicateID.
//
// So that events of one key are published in commit order, Add takes a
// transaction-scoped advisory lock per destination and key: until tx ends,
// another transaction adding an event with the same destination and key
// waits. Add all of a transaction's keyed events in one call (its locks are
// taken in a fixed order); transactions that add keys in different orders
// across several calls may deadlock, which PostgreSQL detects and breaks by
// failing one of them. With [WithNotify], Add also queues a notification,
// sent when tx commits, that wakes the relays.
//
// When ctx carries an OpenTelemetry span, each event without a traceparent
// header gets its W3C trace context as headers, so that the consumer's span
// continues the trace of the request that wrote it.
func (o *Outbox) Add(ctx context.Context, tx pgx.Tx, events ...Event) ([]string, error) {
	if nilcheck.IsNil(tx) {
		return nil, fmt.Errorf("%w: nil transaction", errConfig)
	}
	if len(events) == 0 {
		return nil, nil
	}
	n := len(events)
	ids := make([]string, n)
	dests := make([]string, n)
	keys := make([][]byte, n)
	headers := make([][]byte, n)
	payloads := make([][]byte, n)
	tenants := make([]*string, n)
	var locks []int64
	traced := trace.SpanContextFromContext(ctx).IsValid()
	for i := range events {
		e := events[i]
		if e.ID == "" {
			e.ID = NewID()
		}
		if reason := e.check(); reason != "" {
			return nil, &EventError{Index: i, ID: e.ID, Reason: reason}
		}
		ids[i], dests[i], payloads[i] = e.ID, e.Destination, e.Payload
		if len(e.Key) > 0 {
			keys[i] = e.Key
			locks = append(locks, keyLock(e.Destination, e.Key))
		}
		if traced {
			e.Headers = withTraceContext(ctx, e.Headers)
		}
		if len(e.Headers) > 0 {
			headers[i], _ = json.Marshal(e.Headers) // []Header always marshals
		}
		if e.Tenant != "" {
			tenants[i] = &e.Tenant
		}
	}
	slices.Sort(locks)
	locks = slices.Compact(locks)

	b := &pgx.Batch{}
	if len(locks) > 0 {
		b.Queue(o.sql.lockKeys, locks)
	}
	b.Queue(o.sql.insert, ids, dests, keys, headers, payloads, tenants)
	if o.notify {
		b.Queue(o.sql.notify, o.channel)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, o.addError(err)
	}
	return ids, nil
}

func (o *Outbox) addError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return fmt.Errorf("%w: %s", ErrDuplicateID, pgErr.Detail)
	}
	if err = o.notMigrated(err); errors.Is(err, ErrNotMigrated) {
		return err
	}
	return fmt.Errorf("outbox: add: %w", err)
}

// keyLock is the advisory lock of a destination and key. Two keys sharing a
// hash only serialise their writers; order is unaffected.
func keyLock(destination string, key []byte) int64 {
	h := fnv.New64a()
	h.Write([]byte(destination))
	h.Write([]byte{0})
	h.Write(key)
	return int64(h.Sum64())
}
