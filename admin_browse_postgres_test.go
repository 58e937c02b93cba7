package dedup

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/dedupkit/dedup/internal/testenv"
)

// TestPostgresConsolePlans checks the plan of every console query that
// runs whatever the table's size: on a table shaped like production's (200
// thousand records, nearly all succeeded, written over two days, analyzed),
// each reads the records through the console's indexes and none reads the
// whole table (no Seq Scan). The plans are the planner's own choice, with
// nothing disabled: a plan that holds at this size and shape holds on a
// larger table of the same shape, where a whole-table read only costs
// more. (The exact count of succeeded records, which does read them, runs
// on tables of up to 16 MB only; see PostgresStore.Summary.)
func TestPostgresConsolePlans(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	s := newTestPostgresStore(t, pool)
	if err := s.CreateConsoleIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := pool.Exec(ctx, `INSERT INTO `+s.table+` (expires_at, scope, event_id, fingerprint, status, attempts, owner,
	lease_until, created_at, updated_at, last_error, first_failure, last_failure)
SELECT now() + interval '5 days', 'scope-' || (i % 20), 'event-' || i, '\x0066'::bytea,
	CASE WHEN i % 100 < 95 THEN 2 WHEN i % 100 < 97 THEN 1 WHEN i % 100 < 98 THEN 3 ELSE 4 END, 1, '\x006f'::bytea,
	now() - (200000 - i) * interval '864 milliseconds' + CASE WHEN i % 2 = 0 THEN interval '1 minute' ELSE interval '-1 minute' END,
	now() - (200000 - i) * interval '864 milliseconds', now() - (200000 - i) * interval '864 milliseconds',
	CASE WHEN i % 100 >= 97 THEN 'reason ' || (i % 7) END,
	CASE WHEN i % 100 >= 97 THEN now() - (200000 - i) * interval '864 milliseconds' END,
	CASE WHEN i % 100 >= 97 THEN now() - (200000 - i) * interval '864 milliseconds' END
FROM generate_series(1, 200000) AS i`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+s.table); err != nil {
		t.Fatal(err)
	}
	_, bare := splitTable(s.table)
	infinity := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	after := pgtype.Timestamptz{Time: time.Now().Add(-time.Hour), Valid: true}
	for _, c := range []struct {
		name, sql, index string
		args             []any
	}{
		{"counts", s.console.counts, consoleIndex, []any{"", time.Minute}},
		{"counts of a scope", s.console.counts, consoleIndex, []any{"scope-3", time.Minute}},
		{"oldest in flight", s.console.oldest, consoleIndex, []any{""}},
		{"failures", s.console.failure, consoleIndex, []any{"", time.Hour}},
		{"written", s.console.written, createdIndex, []any{"", time.Hour}},
		{"written in a scope", s.console.written, createdIndex, []any{"scope-3", time.Hour}},
		{"failed final, first page", s.console.failedFinal, consoleIndex, []any{"", "", infinity, "", "", 50}},
		{"failed final, a later page", s.console.failedFinal, consoleIndex, []any{"", "", after, "scope-1", "event-1", 50}},
		{"failed final, filtered", s.console.failedFinal, consoleIndex, []any{"scope-4", "reason 4", infinity, "", "", 50}},
		{"stuck, first page", s.console.stuck, consoleIndex, []any{"", "", infinity, "", "", 50, time.Minute}},
		{"stuck, a later page", s.console.stuck, consoleIndex, []any{"scope-2", "", after, "scope-2", "event-9", 50, time.Minute}},
	} {
		rows, err := pool.Query(ctx, "EXPLAIN "+c.sql, c.args...)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var lines []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			lines = append(lines, line)
		}
		rows.Close()
		plan := strings.Join(lines, "\n")
		if strings.Contains(plan, "Seq Scan") || !strings.Contains(plan, bare+c.index) {
			t.Errorf("%s: the plan does not read through %s%s alone:\n%s", c.name, bare, c.index, plan)
		}
	}
	missing, err := s.MissingConsoleIndexes(ctx)
	if err != nil || len(missing) != 0 {
		t.Errorf("MissingConsoleIndexes = %v, %v; want none", missing, err)
	}
}

func TestPostgresMissingConsoleIndexes(t *testing.T) {
	s := newTestPostgresStore(t, testenv.Postgres(t))
	missing, err := s.MissingConsoleIndexes(context.Background())
	if err != nil || len(missing) != 2 {
		t.Fatalf("MissingConsoleIndexes = %v, %v; want both", missing, err)
	}
	for range 2 { // idempotent
		if err := s.CreateConsoleIndexes(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if missing, err = s.MissingConsoleIndexes(context.Background()); err != nil || len(missing) != 0 {
		t.Fatalf("after CreateConsoleIndexes: %v, %v", missing, err)
	}
}
