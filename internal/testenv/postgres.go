package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultPostgresDSN is the database tests use when DEDUP_POSTGRES_DSN is unset.
const DefaultPostgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// Postgres returns a pool connected to DEDUP_POSTGRES_DSN, closed when t
// ends, or reports PostgreSQL unavailable.
func Postgres(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(Env("DEDUP_POSTGRES_DSN", DefaultPostgresDSN))
	if err != nil {
		t.Fatalf("DEDUP_POSTGRES_DSN: %v", err)
	}
	// No connect timeout of the pool's own: on a loaded machine a test's
	// connection may take seconds, and the test's context bounds it. The
	// availability check below is bounded, generously: a server that is not
	// there refuses at once.
	//
	// Room for the 50-goroutine races to reach the server concurrently, well
	// under the server's default max_connections of 100.
	cfg.MaxConns = 20
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
		if err != nil {
			pool.Close()
		}
	}
	if err != nil {
		Unavailable(t, "PostgreSQL", err)
		return nil
	}
	t.Cleanup(pool.Close)
	return pool
}
