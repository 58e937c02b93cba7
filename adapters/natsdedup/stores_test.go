package natsdedup_test

import (
	"context"
	"testing"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/testenv"
)

// storeCase opens one kind of store for a test.
type storeCase struct {
	name string
	open func(t *testing.T) dedup.Store
}

// stores lists the stores the end-to-end tests run with: memory, and
// PostgreSQL on a table of the test's own.
func stores() []storeCase {
	return []storeCase{
		{"memory", func(*testing.T) dedup.Store { return dedup.NewMemoryStore() }},
		{"postgres", postgresStore},
	}
}

func postgresStore(t *testing.T) dedup.Store {
	pool := testenv.Postgres(t)
	table := "natsdedup_test_" + token()
	s, err := dedup.NewPostgresStore(pool, dedup.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table); err != nil {
			t.Errorf("drop %s: %v", table, err)
		}
	})
	return s
}
