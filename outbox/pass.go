package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup"
)

// maxErrorText bounds the error text kept in a row.
const maxErrorText = 1000

// beginPass begins a pass's transaction exempt from the database's
// idle_in_transaction_session_timeout (the transaction is idle while the
// broker works, and a session ended then would have the batch published
// again) and with planSettings. Sent with BEGIN, it costs no round trip.
const beginPass = "BEGIN; SET LOCAL idle_in_transaction_session_timeout = 0; " + planSettings

// planSettings give each statement of a pass one plan whatever the table's
// statistics say. Statistics taken while nothing was pending (what
// autovacuum sees most of the day) make every index of pending rows look
// empty, and the planner then reads a backlog through the wrong one, once
// per row. With sorts, sequential and bitmap scans priced out, each
// statement is left one plan (sql.go says which). jit is off because a
// priced-out sort (the read's last ORDER BY, which has no other way) makes
// the plan's cost look high enough to compile: 170 ms a pass.
const planSettings = "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; SET LOCAL enable_sort = off; SET LOCAL jit = off"

// pass publishes one batch of due events in one transaction: its row locks
// keep other relays off the batch until the broker's acknowledgements are
// recorded, and a relay dying at any point rolls it back, leaving the rows
// pending. It returns how many events it settled: sent, or failed and
// backed off; events left unattempted do not count, so that a batch of them
// never makes the relay loop at once.
func (r *Relay) pass(ctx context.Context, pool *pgxpool.Pool) (_ int, err error) {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: beginPass})
	if err != nil {
		return 0, fmt.Errorf("outbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	var f failures // the publish failures, and the rows that cannot be read
	seqs, events, err := r.claim(ctx, tx, &f)
	if err != nil || len(events)+len(f.seqs) == 0 {
		return 0, err
	}
	ctx, span := r.tel.startPass(ctx, events)
	defer func() { r.tel.endPass(span, err) }()

	var errs []error
	var sent []int64
	if len(events) > 0 {
		pctx, pspan := r.tel.startPublish(ctx, events)
		pctx, cancel := context.WithTimeout(pctx, r.cfg.publishTimeout)
		errs = r.pub.Publish(pctx, events)
		cancel()
		defer func() { r.tel.endPublish(ctx, pspan, len(sent), &f) }()
	}
	if len(errs) != len(events) {
		err := fmt.Errorf("outbox: publisher returned %d results for %d events", len(errs), len(events))
		errs = make([]error, len(events))
		for i := range errs {
			errs[i] = err
		}
	}

	for i, perr := range errs {
		switch {
		case perr == nil:
			sent = append(sent, seqs[i])
		case errors.Is(perr, ErrNotAttempted):
		case ctx.Err() != nil:
			// Shutting down: the publish was cut short, not refused.
		default:
			f.add(seqs[i], &events[i], perr, r.cfg.backoff(events[i].Attempts+1))
		}
	}

	// The acknowledgements are recorded even when ctx was cancelled during
	// the publish, so that a graceful stop does not publish them again.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if len(sent) > 0 {
		q := r.ob.sql.markSent
		if r.cfg.deleteSent {
			q = r.ob.sql.deleteSent
		}
		if _, err := tx.Exec(sctx, q, sent); err != nil {
			return 0, fmt.Errorf("outbox: mark %d events sent: %w", len(sent), err)
		}
	}
	if len(f.seqs) > 0 {
		if _, err := tx.Exec(sctx, r.ob.sql.markFailed, f.seqs, f.texts, f.delays, r.cfg.maxAttempts, f.permanent); err != nil {
			return 0, fmt.Errorf("outbox: record %d publish failures: %w", len(f.seqs), err)
		}
	}
	if err := tx.Commit(sctx); err != nil {
		return 0, fmt.Errorf("outbox: commit pass: %w", err)
	}
	r.tel.failedForGood(ctx, r.logFailures(&f))
	return len(sent) + len(f.seqs), nil
}

// claim locks a batch of due events and reads them. A row that cannot be
// read as an event is added to f, failed for good, rather than failing the
// pass: it would otherwise fail every pass and hold the relay up.
func (r *Relay) claim(ctx context.Context, tx pgx.Tx, f *failures) ([]int64, []Event, error) {
	rows, err := tx.Query(ctx, r.ob.sql.claim, r.cfg.batch, r.ob.relays)
	if err != nil {
		return nil, nil, r.ob.notMigrated(fmt.Errorf("outbox: claim: %w", err))
	}
	claimed, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(claimed) == 0 {
		return nil, nil, r.ob.notMigrated(wrapClaim(err))
	}
	rows, err = tx.Query(ctx, r.ob.sql.read, claimed)
	if err != nil {
		return nil, nil, fmt.Errorf("outbox: claim: %w", err)
	}
	defer rows.Close()
	var seqs []int64
	var events []Event
	for rows.Next() {
		var (
			seq     int64
			e       Event
			headers []byte
			tenant  *string
		)
		if err := rows.Scan(&seq, &e.ID, &e.Destination, &e.Key, &headers, &e.Payload, &tenant, &e.Attempts); err != nil {
			return nil, nil, fmt.Errorf("outbox: claim: %w", err)
		}
		if headers != nil {
			if err := json.Unmarshal(headers, &e.Headers); err != nil {
				f.add(seq, &e, dedup.Permanent(fmt.Errorf("outbox: event %s: unreadable headers: %w", e.ID, err)), 0)
				continue
			}
		}
		if tenant != nil {
			e.Tenant = *tenant
		}
		seqs = append(seqs, seq)
		events = append(events, e)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, r.ob.notMigrated(fmt.Errorf("outbox: claim: %w", err))
	}
	return seqs, events, nil
}

func wrapClaim(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("outbox: claim: %w", err)
}

// failures are the publish failures of a pass: markFailed's arguments, and
// the events for the log.
type failures struct {
	seqs      []int64
	texts     []string
	delays    []int64
	permanent []bool
	events    []*Event
}

func (f *failures) add(seq int64, e *Event, err error, delay time.Duration) {
	text := err.Error()
	if len(text) > maxErrorText {
		text = text[:maxErrorText]
	}
	f.seqs = append(f.seqs, seq)
	f.texts = append(f.texts, text)
	f.delays = append(f.delays, delay.Milliseconds())
	f.permanent = append(f.permanent, dedup.IsPermanent(err))
	f.events = append(f.events, e)
}

// logFailures logs each event that is now failed, and the retried ones as
// one line. It returns how many are failed.
func (r *Relay) logFailures(f *failures) (failed int) {
	var retried int
	for i, e := range f.events {
		if f.permanent[i] || e.Attempts+1 >= r.cfg.maxAttempts {
			failed++
			r.log.Warn("outbox event failed; requeue it once the cause is fixed",
				slog.String("event_id", e.ID), slog.String("destination", e.Destination),
				slog.Int("attempts", e.Attempts+1), slog.String("reason", f.texts[i]))
			continue
		}
		if retried++; retried == 1 {
			defer func() {
				r.log.Warn("outbox publish failed; retrying after backoff", slog.Int("events", retried), slog.String("first_error", f.texts[i]))
			}()
		}
	}
	return failed
}
