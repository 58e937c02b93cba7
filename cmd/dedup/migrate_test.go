package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/testenv"
)

// v1Table creates a table of the v1 schema holding the root package's
// fixture rows (testdata/postgres-v1), dropped when t ends, and returns its
// name.
func v1Table(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	table := "cli_v1_" + deduptype.NewOwnerToken()[:12]
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+table+`, `+table+`_v1`)
	})
	replace := strings.NewReplacer("{{table}}", table, "{{index}}", table+"_expires_at_idx",
		"{{scope}}", "'cli/migrate'", "{{hot}}", "10", "{{bulk}}", "2000")
	for _, file := range []string{"schema.sql", "rows.sql"} {
		b, err := os.ReadFile("../../testdata/postgres-v1/" + file)
		require.NoError(t, err)
		_, err = pool.Exec(context.Background(), replace.Replace(string(b)), pgx.QueryExecModeSimpleProtocol)
		require.NoError(t, err, file)
	}
	return table
}

// statusType returns the type of the table's status column: text in v1,
// smallint in v2.
func statusType(t *testing.T, pool *pgxpool.Pool, table string) string {
	t.Helper()
	var typ string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attname = 'status'`, table).Scan(&typ))
	return typ
}

// The dry run prints the plan and changes nothing; -yes migrates; once
// migrated, there is nothing to do.
func TestMigrate(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx := context.Background()
	dsn := testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN)
	table := v1Table(t, pool)
	store, err := dedup.NewPostgresStore(pool, dedup.WithTable(table))
	require.NoError(t, err)
	plan, err := store.MigrationPlan(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, plan.Steps)
	var rows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&rows))

	code, out, errOut := cli(t, "migrate", "-postgres", dsn, "-table", table)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "table: "+plan.Table)
	require.Contains(t, out, "state: v1")
	for _, step := range plan.Steps {
		for _, line := range strings.Split(strings.TrimSpace(step.SQL), "\n") {
			require.Contains(t, out, strings.TrimSpace(line))
		}
		require.Contains(t, out, step.Locks)
	}
	require.Contains(t, out, "dry run: nothing changed")
	require.Equal(t, "text", statusType(t, pool, table), "the dry run migrated")
	var v1Exists bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table+"_v1").Scan(&v1Exists))
	require.False(t, v1Exists, "the dry run began the migration")

	code, out, errOut = cli(t, "migrate", "-postgres", dsn, "-table", table, "-yes")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "migrated "+plan.Table+": v1 -> v2")
	require.Equal(t, "smallint", statusType(t, pool, table))
	var after int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE expires_at > now()`).Scan(&after))
	require.Equal(t, rows-1, after, "every live record migrated") // the fixture's one expired record may go
	fp, err := dedup.SHA256Fingerprint()([]byte("body:live"))
	require.NoError(t, err)
	c, err := store.Claim(ctx, dedup.ClaimRequest{Key: dedup.Key{Scope: "cli/migrate", EventID: "live"},
		Fingerprint: fp, Lease: time.Minute, TTL: time.Hour})
	require.NoError(t, err)
	require.Equal(t, dedup.ClaimInFlight, c.Status, "the fixture's live lease, migrated")

	code, out, errOut = cli(t, "migrate", "-postgres", dsn, "-table", table)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "state: v2")
	require.Contains(t, out, "nothing to do")
}

func TestMigrateUsage(t *testing.T) {
	t.Setenv("DEDUP_POSTGRES_DSN", "")
	for _, args := range [][]string{
		{"migrate"},
		{"migrate", "-postgres", "postgres://x", "extra"},
		{"migrate", "-postgres", "postgres://x", "-table", "a-b"},
	} {
		code, _, _ := cli(t, args...)
		require.Equal(t, 2, code, "%q", args)
	}
	code, _, _ := cli(t, "migrate", "-h")
	require.Equal(t, 0, code)
}
