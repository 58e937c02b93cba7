package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dedupkit/dedup/internal/testenv"
)

// TestKeptTables runs the rows of -records and -purge on small tables, twice:
// the first run fills the kept tables, the second finds them filled; each row
// meets its table holding the fill, and the purge rows' Purge deletes every
// expired record.
func TestKeptTables(t *testing.T) {
	testenv.Postgres(t)
	dsn := testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN)
	p := plan{
		cfg: config{
			Postgres: dsn, Partitions: 2, BatchWait: 50 * time.Millisecond,
			FetchPartitionBytes: 128 << 10, Prefix: fmt.Sprintf("dedupbench_test_%d", os.Getpid()),
		},
		n: 300, dup: 0.2, repeat: 1, records: []int{0, 200}, purge: 100,
		only: []string{"batch-claim", "inbox", "floor"},
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), dsn)
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		for _, row := range p.only {
			_, _ = conn.Exec(context.Background(), "DROP TABLE IF EXISTS "+keptTable(p.cfg.Prefix, row))
		}
	})
	for run := range 2 {
		out := filepath.Join(t.TempDir(), "results.json")
		if err := p.run(t.Context(), out, false); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		var rep report
		if err := json.Unmarshal(data, &rep); err != nil {
			t.Fatal(err)
		}
		for _, b := range rep.Builds {
			if b.Expired == 0 && (b.To != 200 || run == 1 && b.From != 200) {
				t.Errorf("run %d built %s", run, b)
			}
		}
		var sized, purged int
		for _, r := range rep.Results {
			if r.TableShape == "" || r.TableBytesPerMillion <= 0 || r.P99ClaimMicros <= 0 || r.RatioToFloor <= 0 {
				t.Errorf("run %d: row %s (table %d): %+v", run, r.Row, r.TableRecords, r)
			}
			if r.TableRecords == 200 {
				sized++
			}
			if r.PurgeExpired > 0 {
				purged++
				if r.Purged != 100 {
					t.Errorf("run %d: row %s purged %d of 100", run, r.Row, r.Purged)
				}
			}
		}
		if sized != 5 || purged != 2 {
			t.Errorf("run %d: %d rows at 200 records (want 5: 3, and 2 beside Purge), %d beside Purge", run, sized, purged)
		}
	}
}
