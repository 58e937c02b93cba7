package testenv

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// PostgresInSchema returns a pool, and the DSN it was opened with, whose
// unqualified tables live in a schema of their own, dropped when t ends: for
// the example programs, which name their tables, so that two test runs side
// by side (a make test beside another) do not drop each other's.
func PostgresInSchema(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	base := Postgres(t)
	schema := fmt.Sprintf("t%d_%d", os.Getpid(), time.Now().UnixNano())
	if _, err := base.Exec(context.Background(), "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create schema %s: %v", schema, err)
	}
	t.Cleanup(func() { _, _ = base.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	dsn := Env("DEDUP_POSTGRES_DSN", DefaultPostgresDSN)
	switch {
	case !strings.Contains(dsn, "://"):
		dsn += " search_path=" + schema
	case strings.Contains(dsn, "?"):
		dsn += "&search_path=" + schema
	default:
		dsn += "?search_path=" + schema
	}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatalf("connect in schema %s: %v", schema, err)
	}
	t.Cleanup(pool.Close)
	return pool, dsn
}
