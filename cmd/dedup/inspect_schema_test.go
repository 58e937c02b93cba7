package main

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/testenv"
)

// A table migrated in another schema than the connection's search_path
// gives is not reported as missing ("run Migrate"): the error says where
// PostgreSQL looked, the schema the table is in, and the -table or
// search_path that finds it. A table that exists nowhere says to migrate.
func TestInspectTableInAnotherSchema(t *testing.T) {
	ctx := context.Background()
	pool, _ := testenv.PostgresInSchema(t)
	var schema string
	require.NoError(t, pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema))
	table := "cli_schema_" + strings.ToLower(deduptype.NewOwnerToken()[:12])
	store, err := dedup.NewPostgresStore(pool, dedup.WithTable(table))
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	dsn := testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN) // the default search_path
	inspect := func(table string) string {
		code, _, errOut := cli(t, "inspect", "-postgres", dsn, "-table", table, "-scope", "s", "-id", "i")
		require.Equal(t, 1, code, errOut)
		return errOut
	}

	errOut := inspect(table)
	for _, want := range []string{"table " + table + " does not exist in the schemas the search_path gives user ",
		"exists in schema " + schema, "-table " + schema + "." + table, "search_path=" + schema} {
		require.Contains(t, errOut, want)
	}
	require.NotContains(t, errOut, "Migrate")

	errOut = inspect("public." + table)
	require.Contains(t, errOut, "table public."+table+" does not exist in schema public, but a table "+table+" exists in schema "+schema)

	require.Contains(t, inspect(schema+"."+table), "no record of s/i", "the table named with its schema is found")

	missing := "cli_nowhere_" + strings.ToLower(deduptype.NewOwnerToken()[:12])
	require.Contains(t, inspect(missing), "table "+missing+" does not exist in the schemas the search_path gives user ")
	require.Contains(t, inspect(missing), "nor in any other schema: create it with dedup migrate -table "+missing+" -yes")
}
