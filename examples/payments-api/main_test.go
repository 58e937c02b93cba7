package main

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup/internal/testenv"
)

// TestDemo runs the -demo session against the memory store and against
// PostgreSQL in transactional mode; its own check (one gateway charge, the
// documented answers) decides the result.
func TestDemo(t *testing.T) {
	for _, tc := range []struct {
		name string
		pool func(t *testing.T) *pgxpool.Pool
	}{
		{"memory", func(*testing.T) *pgxpool.Pool { return nil }},
		{"postgres", func(t *testing.T) *pgxpool.Pool { pool, _ := testenv.PostgresInSchema(t); return pool }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gw := &gateway{}
			h, err := handler(context.Background(), gw, tc.pool(t))
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(h)
			defer srv.Close()
			if err := runDemo(srv.URL, gw); err != nil {
				t.Fatal(err)
			}
		})
	}
}
