package main

import (
	"context"
	"fmt"
	"io"
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

func runOutbox(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || (args[0] != "status" && args[0] != "requeue") {
		return fmt.Errorf("%w: dedup outbox status|requeue [flags]", errUsage)
	}
	sub := args[0]
	fs := newFlags("outbox " + sub)
	dsn := fs.String("postgres", env("DEDUP_POSTGRES_DSN", ""), "PostgreSQL DSN of the outbox (DEDUP_POSTGRES_DSN)")
	table := fs.String("table", outbox.DefaultTable, "the outbox table")
	limit := fs.Int("limit", 20, "failed events to list at most")
	var ids idList
	all := new(bool)
	yes := new(bool)
	if sub == "requeue" {
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
	failed, err := ob.Failed(ctx, pool, *limit)
	if err != nil {
		return err
	}
	if sub == "status" {
		st, err := ob.Stats(ctx, pool)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "pending %d (oldest %s), failed %d, sent %d\n", st.Pending, st.OldestPending.Round(time.Millisecond), st.Failed, st.Sent)
		printFailed(out, failed)
		return nil
	}
	if *all {
		ids = ids[:0]
		for _, f := range failed {
			ids = append(ids, f.ID)
		}
	}
	if !*yes {
		fmt.Fprintf(out, "would requeue %d events: %s; run with -yes\n", len(ids), strings.Join(ids, ", "))
		return nil
	}
	n, err := ob.Requeue(ctx, pool, ids...)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "requeued %d of %d events (an ID that is not a failed event is ignored)\n", n, len(ids))
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
