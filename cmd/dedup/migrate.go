package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup"
)

// runMigrate is `dedup migrate`: it prints what (*PostgresStore).Migrate
// would do to the table now (the statements, the rows each touches, the
// locks each takes), and with -yes does it. The migration is online: the
// consumers of this version keep working while it runs, and it may be
// interrupted and run again.
func runMigrate(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("migrate")
	dsn := fs.String("postgres", env("DEDUP_POSTGRES_DSN", ""), "PostgreSQL DSN of the store (DEDUP_POSTGRES_DSN)")
	table := fs.String("table", dedup.DefaultTable, "table of the PostgreSQL store")
	yes := fs.Bool("yes", false, "migrate (default: print the plan and change nothing)")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	if *dsn == "" {
		return fmt.Errorf("%w: -postgres (or DEDUP_POSTGRES_DSN) is required", errUsage)
	}
	pool, err := pgxpool.New(ctx, *dsn)
	if err != nil {
		return fmt.Errorf("PostgreSQL DSN: %w", err)
	}
	defer pool.Close()
	store, err := dedup.NewPostgresStore(pool, dedup.WithTable(*table))
	if err != nil {
		var nameErr *dedup.TableNameError
		if errors.As(err, &nameErr) {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		return err
	}
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("cannot reach PostgreSQL at %s: %w", redactDSN(*dsn), err)
	}
	plan, err := store.MigrationPlan(ctx)
	if err != nil {
		return err
	}
	printPlan(out, plan)
	if len(plan.Steps) == 0 {
		return nil
	}
	if !*yes {
		fmt.Fprintln(out, "dry run: nothing changed; run with -yes to migrate")
		return nil
	}
	start := time.Now()
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	took := time.Since(start)
	after, err := store.MigrationPlan(ctx)
	if err != nil {
		return fmt.Errorf("migrated in %v, but reading the table's state after: %w", took.Round(time.Millisecond), err)
	}
	fmt.Fprintf(out, "migrated %s: %s -> %s, %d steps in %v\n", plan.Table, plan.State, after.State, len(plan.Steps),
		took.Round(time.Millisecond))
	return nil
}

// printPlan writes plan for people: the table and its state, then each
// step's statement, estimated rows, locks and note.
func printPlan(out io.Writer, plan dedup.MigrationPlan) {
	fmt.Fprintf(out, "table: %s\nstate: %s\n", plan.Table, plan.State)
	switch plan.State {
	case "v2":
		fmt.Fprintln(out, "nothing to do: the table is v2")
		return
	case "migrating":
		fmt.Fprintln(out, "a migration is under way or was interrupted; migrating again resumes it")
	}
	for i, step := range plan.Steps {
		fmt.Fprintf(out, "\nstep %d:\n", i+1)
		if step.Note != "" {
			fmt.Fprintf(out, "  note:  %s\n", step.Note)
		}
		rows := "unknown"
		if step.Rows >= 0 {
			rows = fmt.Sprintf("~%d (estimated)", step.Rows)
		}
		fmt.Fprintf(out, "  rows:  %s\n", rows)
		locks := step.Locks
		if locks == "" {
			locks = "none"
		}
		fmt.Fprintf(out, "  locks: %s\n", locks)
		fmt.Fprintf(out, "  sql:\n    %s\n", strings.ReplaceAll(strings.TrimSpace(step.SQL), "\n", "\n    "))
	}
	fmt.Fprintln(out)
}
