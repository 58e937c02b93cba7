package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup/outbox"
)

// idList collects a repeated -id flag.
type idList []string

func (l *idList) String() string     { return strings.Join(*l, ",") }
func (l *idList) Set(v string) error { *l = append(*l, v); return nil }

// statusView is the outbox's status as outbox status -json prints it.
type statusView struct {
	Pending              int64        `json:"pending"`
	Failed               int64        `json:"failed"`
	Sent                 int64        `json:"sent"`
	OldestPendingSeconds float64      `json:"oldest_pending_seconds"`
	FailedEvents         []failedView `json:"failed_events"`
}

// failedView is a failed event as outbox status -json prints it.
type failedView struct {
	EventID     string    `json:"event_id"`
	Destination string    `json:"destination"`
	Key         []byte    `json:"key"` // base64; null when the event has none
	Attempts    int       `json:"attempts"`
	LastError   string    `json:"last_error"`
	CreatedAt   time.Time `json:"created_at"`
	DueAt       time.Time `json:"due_at"`
}

func runOutbox(ctx context.Context, args []string, out io.Writer) error {
	if len(args) > 0 && isHelp(args[0]) {
		return help(os.Stderr, "dedup outbox status|requeue [flags]: the outbox's state, and failed events sent again",
			"status", "counts by state, the oldest pending event's age, the failed events",
			"requeue", "make failed events pending again (-id ID ..., or -all; -yes to do it)")
	}
	if len(args) == 0 || (args[0] != "status" && args[0] != "requeue") {
		return fmt.Errorf("%w: dedup outbox status [-json] | requeue [-id ID ...] [-all] [-yes]", errUsage)
	}
	sub := args[0]
	fs := newFlags("outbox " + sub)
	dsn := fs.String("postgres", env("DEDUP_POSTGRES_DSN", ""), "PostgreSQL DSN of the outbox (DEDUP_POSTGRES_DSN)")
	table := fs.String("table", outbox.DefaultTable, "the outbox table")
	limit := fs.Int("limit", 20, "failed events to list at most")
	var ids idList
	all, yes, asJSON := new(bool), new(bool), new(bool)
	if sub == "status" {
		asJSON = fs.Bool("json", false, "print JSON: the counts by state, the age of the oldest pending event in seconds, "+
			"and the failed events (up to -limit; a key is base64, null when the event has none)")
	} else {
		fs.Var(&ids, "id", "a failed event to requeue (repeatable)")
		all = fs.Bool("all", false, "requeue every failed event (up to -limit)")
		yes = fs.Bool("yes", false, "do it (default: list what would be requeued)")
	}
	if err := parse(fs, args[1:], 0); err != nil {
		return err
	}
	if *dsn == "" {
		return fmt.Errorf("%w: -postgres (or DEDUP_POSTGRES_DSN) is required", errUsage)
	}
	if sub == "requeue" && len(ids) == 0 && !*all {
		return fmt.Errorf("%w: name the events with -id, or -all", errUsage)
	}
	ob, err := outbox.New(outbox.WithTable(*table))
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	pool, err := pgxpool.New(ctx, *dsn)
	if err != nil {
		return fmt.Errorf("PostgreSQL DSN: %w", err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("cannot reach PostgreSQL at %s: %w", redactDSN(*dsn), err)
	}
	if sub == "status" {
		return outboxStatus(ctx, ob, pool, *limit, *asJSON, out)
	}
	if *all {
		failed, err := ob.Failed(ctx, pool, *limit)
		if err != nil {
			return err
		}
		ids = ids[:0]
		for _, f := range failed {
			ids = append(ids, f.ID)
		}
	}
	return outboxRequeue(ctx, ob, pool, ids, *yes, out)
}

func outboxStatus(ctx context.Context, ob *outbox.Outbox, pool *pgxpool.Pool, limit int, asJSON bool, out io.Writer) error {
	st, err := ob.Stats(ctx, pool)
	if err != nil {
		return err
	}
	failed, err := ob.Failed(ctx, pool, limit)
	if err != nil {
		return err
	}
	if asJSON {
		v := statusView{Pending: st.Pending, Failed: st.Failed, Sent: st.Sent,
			OldestPendingSeconds: st.OldestPending.Round(time.Millisecond).Seconds(),
			FailedEvents:         make([]failedView, 0, len(failed))}
		for _, f := range failed {
			v.FailedEvents = append(v.FailedEvents, failedView{EventID: f.ID, Destination: f.Destination, Key: f.Key,
				Attempts: f.Attempts, LastError: f.LastError, CreatedAt: f.CreatedAt, DueAt: f.FailedAt})
		}
		return json.NewEncoder(out).Encode(v)
	}
	fmt.Fprintf(out, "pending %d (oldest %s), failed %d, sent %d\n", st.Pending, st.OldestPending.Round(time.Millisecond), st.Failed, st.Sent)
	printFailed(out, failed)
	return nil
}

// outboxRequeue requeues the events of ids that are failed, or with yes
// false says which it would; either way it names the IDs it leaves alone
// because they are not failed events (unknown, pending or sent).
func outboxRequeue(ctx context.Context, ob *outbox.Outbox, pool *pgxpool.Pool, ids []string, yes bool, out io.Writer) error {
	seen := make(map[string]bool, len(ids))
	var uniq []string
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			uniq = append(uniq, id)
		}
	}
	states, err := ob.States(ctx, pool, uniq...)
	if err != nil {
		return err
	}
	var failed, others []string
	for _, id := range uniq {
		switch state, ok := states[id]; {
		case state == "failed":
			failed = append(failed, id)
		case !ok:
			others = append(others, id+" (unknown)")
		default:
			others = append(others, id+" ("+state+")")
		}
	}
	switch {
	case !yes && len(failed) > 0:
		fmt.Fprintf(out, "would requeue %d events: %s; run with -yes\n", len(failed), strings.Join(failed, ", "))
	case !yes:
		fmt.Fprintln(out, "would requeue 0 events")
	case len(failed) == 0:
		fmt.Fprintln(out, "requeued 0 events")
	default:
		n, err := ob.Requeue(ctx, pool, failed...)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "requeued %d of %d events: %s", n, len(failed), strings.Join(failed, ", "))
		if n < int64(len(failed)) {
			fmt.Fprint(out, " (the others were no longer failed: requeued meanwhile)")
		}
		fmt.Fprintln(out)
	}
	if len(others) > 0 {
		fmt.Fprintf(out, "not failed, left as they are: %s\n", strings.Join(others, ", "))
	}
	return nil
}

func printFailed(out io.Writer, failed []outbox.FailedEvent) {
	if len(failed) == 0 {
		return
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FAILED ID\tDESTINATION\tATTEMPTS\tFAILED AT\tLAST ERROR")
	for _, f := range failed {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", f.ID, f.Destination, f.Attempts, stamp(f.FailedAt), f.LastError)
	}
	tw.Flush()
}
