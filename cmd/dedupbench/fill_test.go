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
	"github.com/jackc/pgx/v5/pgxpool"

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
			for _, purge := range []bool{false, true} {
				_, _ = conn.Exec(context.Background(), "DROP TABLE IF EXISTS "+keptTable(p.cfg.Prefix, row, purge))
			}
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

// TestInsertSQLv2 fills a table of record v2's shape (docs: the contract of
// issue 40), whichever store this binary has: store rows as the store path
// writes them, inbox rows with only their four columns, every fingerprint
// and owner packed (32 and 16 bytes, or 0x00 and the hex when it begins
// with 00).
func TestInsertSQLv2(t *testing.T) {
	testenv.Postgres(t)
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	table := fmt.Sprintf("dedupbench_test_v2_%d", os.Getpid())
	if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (
	expires_at timestamptz NOT NULL, scope text COLLATE "C" NOT NULL, event_id text COLLATE "C" NOT NULL,
	fingerprint bytea NOT NULL, status smallint CHECK (status BETWEEN 1 AND 4), attempts integer, owner bytea,
	lease_until timestamptz, created_at timestamptz, updated_at timestamptz, last_error text,
	first_failure timestamptz, last_failure timestamptz, result bytea, previous_status smallint,
	PRIMARY KEY (scope, event_id)) WITH (fillfactor = 50)`); err != nil {
		t.Fatal(err)
	}
	defer pool.Exec(context.Background(), "DROP TABLE "+table)
	if shape, err := tableShape(ctx, pool, table); err != nil || shape != "v2" {
		t.Fatalf("shape %q, %v", shape, err)
	}
	start := time.Now().Add(-time.Hour)
	for _, row := range []string{"batch-claim", "inbox"} {
		if _, err := pool.Exec(ctx, insertSQL(table, "v2", row), scopeOf(row), 0, 2000, fillSuffix, start, int64(1000)); err != nil {
			t.Fatal(row, err)
		}
	}
	var store, inbox, badFP, badOwner, zeroFP int
	err = pool.QueryRow(ctx, `SELECT
	count(*) FILTER (WHERE status = 2 AND attempts = 1 AND lease_until = created_at AND updated_at = created_at
		AND expires_at = created_at + interval '7 days'),
	count(*) FILTER (WHERE status IS NULL AND attempts IS NULL AND owner IS NULL AND created_at IS NULL
		AND expires_at > now() + interval '6 days'),
	count(*) FILTER (WHERE NOT (length(fingerprint) = 32 AND get_byte(fingerprint, 0) <> 0
		OR length(fingerprint) = 65 AND get_byte(fingerprint, 0) = 0 AND encode(substr(fingerprint, 2), 'escape') ~ '^00[0-9a-f]{62}$')),
	count(*) FILTER (WHERE owner IS NOT NULL AND NOT (length(owner) = 16 AND get_byte(owner, 0) <> 0
		OR length(owner) = 33 AND get_byte(owner, 0) = 0)),
	count(*) FILTER (WHERE get_byte(fingerprint, 0) = 0)
FROM `+table).Scan(&store, &inbox, &badFP, &badOwner, &zeroFP)
	if err != nil {
		t.Fatal(err)
	}
	// 1 in 256 fingerprints begins with 00: about 16 of 4,000.
	if store != 2000 || inbox != 2000 || badFP != 0 || badOwner != 0 || zeroFP == 0 {
		t.Errorf("store rows %d, inbox rows %d (want 2000 each); %d bad fingerprints, %d bad owners, %d packed as text", store, inbox, badFP, badOwner, zeroFP)
	}
}
