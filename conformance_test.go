package dedup_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptest"
	"github.com/dedupkit/dedup/internal/testenv"
)

func TestConformance(t *testing.T) {
	t.Run("memory", func(t *testing.T) { deduptest.Run(t, dedup.NewMemoryStore()) })
	t.Run("postgres", func(t *testing.T) {
		pool := testenv.Postgres(t)
		// A table of its own: the suite's Purge case must not race another purger.
		table := "dedup_conformance_" + dedup.NewOwnerToken()[:12]
		s, err := dedup.NewPostgresStore(pool, dedup.WithTable(table))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if _, err := pool.Exec(context.Background(), "DROP TABLE "+pgx.Identifier{table}.Sanitize()); err != nil {
				t.Error(err)
			}
		})
		deduptest.Run(t, s)
	})
}
