package main

// Kept tables: the rows of -records and -purge run on a table that already
// holds records, built once and kept between rows (and between runs):
//
//   - Fill records: keys evt-<k>-f in the row's own scope, k = (i *
//     2654435761) mod 2^32 for i in [0, n) (a bijection: no two collide), so
//     that they spread over the primary key's range among the run's evt-<i>
//     instead of sitting at one end, as random event IDs would; the suffix
//     keeps them apart from the run's events. Created one after another over
//     the last 6 days in heap order, expiring 7 days (the wrapper's default
//     TTL) after: none expires during a run.
//   - Expired records (-purge): keys evt-<k>-x, created 8 to 7 days ago,
//     expired an hour to a day ago.
//
// Each is one INSERT ... SELECT generate_series, followed by VACUUM ANALYZE
// (this machine's PostgreSQL runs no autovacuum; production's would have run
// after such a load). The rows have the table's shape, read from the catalog:
// v1 (fingerprint text) as the v1 store writes them; v2 (fingerprint bytea)
// as the v2 store path writes them (status 2, attempts 1, a 16-byte owner,
// times set), or as the inbox writes them on the inbox row's table; the
// floor's table holds the IDs only.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup"
)

// fillable are the rows that can run on a kept table.
var fillable = []string{"naive", "complete-each", "batch-claim", "batched", "inbox", "floor"}

// purgeRows are the rows run while Purge runs (-purge).
var purgeRows = []string{"batch-claim", "inbox"}

const (
	fillSuffix    = "-f"
	expiredSuffix = "-x"
)

// keptTable names row's kept table; the purge rows have tables of their
// own, so that the space their purges free is not in the other rows' tables.
func keptTable(prefix, row string, purge bool) string {
	name := prefix + "_" + strings.ReplaceAll(row, "-", "_")
	if purge {
		name += "_purge"
	}
	return name + "_kept"
}

// createFloor creates the floor row's table.
func createFloor(table string) string {
	return `CREATE TABLE IF NOT EXISTS ` + table + ` (scope text NOT NULL, event_id text NOT NULL, PRIMARY KEY (scope, event_id))`
}

// tableShape reads table's shape from the catalog: "v1" (fingerprint
// text), "v2" (fingerprint bytea) or "floor" (no fingerprint).
func tableShape(ctx context.Context, pool *pgxpool.Pool, table string) (string, error) {
	var typ string
	err := pool.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = $1::regclass AND attname = 'fingerprint' AND NOT attisdropped`, table).Scan(&typ)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "floor", nil
	case err != nil:
		return "", fmt.Errorf("shape of %s: %w", table, err)
	case typ == "text":
		return "v1", nil
	case typ == "bytea":
		return "v2", nil
	}
	return "", fmt.Errorf("shape of %s: fingerprint is %s", table, typ)
}

// insertSQL returns the statement that writes records i in [$2, $3) of
// row's scope ($1) into table of shape, with the key suffix $4, the first
// created at $5 and each $6 µs after the one before.
func insertSQL(table, shape, row string) string {
	const from = ` FROM generate_series($2::bigint, $3::bigint - 1) AS g
CROSS JOIN LATERAL (SELECT 'evt-' || (g * 2654435761 % 4294967296) || $4::text AS id,
	$5::timestamptz + (g - $2) * $6::bigint * interval '1 microsecond' AS c,
	sha256(convert_to(g || $4::text, 'UTF8')) AS fp,
	decode(md5(g || $4::text || 'owner'), 'hex') AS owner) AS r`
	// The v2 packing of a canonical hex string's bytes h: h, or, when its
	// hex starts with 00, '\x00' and the hex.
	pack := func(h string) string {
		return `CASE WHEN get_byte(` + h + `, 0) = 0 THEN '\x00'::bytea || convert_to(encode(` + h + `, 'hex'), 'UTF8') ELSE ` + h + ` END`
	}
	switch {
	case shape == "floor":
		return `INSERT INTO ` + table + ` (scope, event_id) SELECT $1, id` + from
	case shape == "v1":
		return `INSERT INTO ` + table + ` (scope, event_id, status, fingerprint, attempts, owner, lease_until, created_at, updated_at, expires_at)
SELECT $1, id, 'SUCCEEDED', encode(fp, 'hex'), 1, encode(owner, 'hex'), c, c, c, c + interval '7 days'` + from
	case row == "inbox":
		return `INSERT INTO ` + table + ` (expires_at, scope, event_id, fingerprint)
SELECT c + interval '7 days', $1, id, ` + pack("fp") + from
	}
	return `INSERT INTO ` + table + ` (expires_at, scope, event_id, fingerprint, status, attempts, owner, lease_until, created_at, updated_at)
SELECT c + interval '7 days', $1, id, ` + pack("fp") + `, 2, 1, ` + pack("owner") + `, c, c, c` + from
}

// build is the making of a kept table for a size: how long it took.
type build struct {
	Table   string `json:"table"`
	Shape   string `json:"shape"`
	From    int64  `json:"from_records"` // fill records it held before
	To      int    `json:"to_records"`
	Expired int    `json:"expired_records,omitempty"`
	// Cleared are records other than the fill found there (an earlier
	// run's events) and deleted.
	Cleared       int64   `json:"cleared_records,omitempty"`
	InsertSeconds float64 `json:"insert_seconds"`
	VacuumSeconds float64 `json:"vacuum_analyze_seconds"`
}

func (b build) String() string {
	what := fmt.Sprintf("%s -> %s records", thousands(float64(b.From)), thousands(float64(b.To)))
	if b.Expired > 0 {
		what = fmt.Sprintf("+%s expired records", thousands(float64(b.Expired)))
	}
	if b.Cleared > 0 {
		what += fmt.Sprintf(" (%s earlier events deleted)", thousands(float64(b.Cleared)))
	}
	return fmt.Sprintf("%s (%s): %s in %.1fs (INSERT %.1fs, VACUUM ANALYZE %.1fs)",
		b.Table, b.Shape, what, b.InsertSeconds+b.VacuumSeconds, b.InsertSeconds, b.VacuumSeconds)
}

// ensureKept creates row's kept table if need be (the store's Migrate, or
// the floor's CREATE) and returns its name and shape.
func ensureKept(ctx context.Context, pool *pgxpool.Pool, table, row string) (string, string, error) {
	if row == "floor" {
		if _, err := pool.Exec(ctx, createFloor(table)); err != nil {
			return "", "", err
		}
	} else {
		store, err := dedup.NewPostgresStore(pool, dedup.WithTable(table))
		if err == nil {
			err = store.Migrate(ctx)
		}
		if err != nil {
			return "", "", fmt.Errorf("%s: %w", table, err)
		}
	}
	shape, err := tableShape(ctx, pool, table)
	return table, shape, err
}

// fillKept makes row's kept table hold exactly n fill records and nothing
// else. It returns nil when the table held them already.
func fillKept(ctx context.Context, pool *pgxpool.Pool, table, row string, n int) (*build, error) {
	table, shape, err := ensureKept(ctx, pool, table, row)
	if err != nil {
		return nil, err
	}
	b := &build{Table: table, Shape: shape, To: n}
	var total int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE event_id LIKE '%`+fillSuffix+`'), count(*) FROM `+table).
		Scan(&b.From, &total); err != nil {
		return nil, err
	}
	if b.From == int64(n) && total == b.From {
		return nil, nil
	}
	t := time.Now() // the insert's time includes deleting earlier events
	if b.Cleared = total - b.From; b.Cleared > 0 {
		if _, err := pool.Exec(ctx, `DELETE FROM `+table+` WHERE event_id NOT LIKE '%`+fillSuffix+`'`); err != nil {
			return nil, err
		}
	}
	if b.From > int64(n) {
		if _, err := pool.Exec(ctx, `TRUNCATE `+table); err != nil {
			return nil, err
		}
		b.From = 0
	}
	// Created one after another over the last 6 days, the new ones after
	// those already there.
	if b.From < int64(n) {
		span := 6 * 24 * time.Hour
		step := span / time.Duration(n)
		first := time.Now().Add(-span + time.Duration(b.From)*step)
		if _, err := pool.Exec(ctx, insertSQL(table, shape, row), scopeOf(row), b.From, n, fillSuffix, first, step.Microseconds()); err != nil {
			return nil, fmt.Errorf("fill %s: %w", table, err)
		}
	}
	b.InsertSeconds = time.Since(t).Seconds()
	t = time.Now()
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+table); err != nil {
		return nil, err
	}
	b.VacuumSeconds = time.Since(t).Seconds()
	return b, nil
}

// addExpired adds n expired records to row's kept table, for Purge to delete
// while the row runs.
func addExpired(ctx context.Context, pool *pgxpool.Pool, table, row string, n int) (*build, error) {
	table, shape, err := ensureKept(ctx, pool, table, row)
	if err != nil {
		return nil, err
	}
	b := &build{Table: table, Shape: shape, Expired: n}
	t := time.Now()
	// Created 8 days ago to 7 days and an hour ago: expired an hour to a
	// day ago. A record an interrupted purge left is there already.
	span := 23 * time.Hour
	step := span / time.Duration(n)
	if _, err := pool.Exec(ctx, insertSQL(table, shape, row)+` ON CONFLICT DO NOTHING`,
		scopeOf(row), 0, n, expiredSuffix, time.Now().Add(-8*24*time.Hour), step.Microseconds()); err != nil {
		return nil, fmt.Errorf("expired records into %s: %w", table, err)
	}
	b.InsertSeconds = time.Since(t).Seconds()
	t = time.Now()
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+table); err != nil {
		return nil, err
	}
	b.VacuumSeconds = time.Since(t).Seconds()
	return b, nil
}

// resetKept deletes from a kept table the events of an earlier row (evt-0
// to evt-<unique-1> of scope), and vacuums what they left, so that every row
// meets the same table: the fill, and nothing dead.
func resetKept(ctx context.Context, pool *pgxpool.Pool, table, scope string, unique int) error {
	tag, err := pool.Exec(ctx, `DELETE FROM `+table+` WHERE scope = $1
AND event_id IN (SELECT 'evt-' || g FROM generate_series(0, $2::int - 1) AS g)`, scope, unique)
	if err != nil {
		return fmt.Errorf("reset %s: %w", table, err)
	}
	if tag.RowsAffected() > 0 {
		_, err = pool.Exec(ctx, `VACUUM `+table)
	}
	return err
}

// purgeRun is a Purge running beside a row (-purge).
type purgeRun struct {
	began, ended int64 // ns since start
	purged       int
	err          error
	cpu          time.Duration // its backend's CPU time
}

// startPurge starts store.Purge on table beside the row when cfg asks for
// it, on a pool of its own, whose round trips and backend CPU are not the
// row's; it returns a function that waits for the purge to end.
func startPurge(ctx context.Context, cfg config, m *meter, table string) (wait func()) {
	if cfg.Purge == 0 {
		return func() {}
	}
	pr := &purgeRun{}
	m.purge = pr
	pc, err := pgxpool.ParseConfig(cfg.Postgres)
	if err != nil {
		pr.err = err
		return func() {}
	}
	app := "dedupbench purge " + table
	pc.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		pr.err = err
		return func() {}
	}
	store, err := dedup.NewPostgresStore(pool, dedup.WithTable(table))
	if err != nil {
		pool.Close()
		pr.err = err
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		pr.began = now()
		// The purge runs to its end, after the row's if need be: the next
		// row meets a table without expired records.
		pr.purged, pr.err = store.Purge(context.WithoutCancel(ctx))
		pr.ended = now()
		for _, t := range backendCPU(context.Background(), pool, app) {
			pr.cpu += t
		}
	}()
	return func() {
		<-done
		pool.Close()
	}
}

// tableBytes returns pg_total_relation_size of table: heap, indexes, TOAST.
func tableBytes(ctx context.Context, pool *pgxpool.Pool, table string) int64 {
	var n int64
	if err := pool.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass)`, table).Scan(&n); err != nil {
		return 0
	}
	return n
}

// keptTables builds the kept tables for the parent, holding an advisory
// lock on their prefix so that two runs do not build the same tables.
type keptTables struct {
	pool   *pgxpool.Pool
	prefix string
	lock   *pgxpool.Conn
	done   map[string]int // table -> the size it was made to hold
}

func openKept(ctx context.Context, cfg config) (*keptTables, error) {
	pc, err := pgxpool.ParseConfig(cfg.Postgres)
	if err != nil {
		return nil, err
	}
	pc.ConnConfig.RuntimeParams["application_name"] = "dedupbench fill"
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	k := &keptTables{pool: pool, prefix: cfg.Prefix, done: map[string]int{}}
	if k.lock, err = pool.Acquire(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	var locked bool
	if err := k.lock.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtext('dedupbench kept ' || $1))`, cfg.Prefix).Scan(&locked); err != nil || !locked {
		k.close()
		if err == nil {
			err = fmt.Errorf("another dedupbench runs on the tables %s_*_kept (use -tables)", cfg.Prefix)
		}
		return nil, err
	}
	return k, nil
}

func (k *keptTables) close() {
	k.lock.Release() // the session ends with the pool, and its lock with it
	k.pool.Close()
}

// prepare makes j's kept table hold j.fill records, and j.purge expired ones
// besides, and returns what it built.
func (k *keptTables) prepare(ctx context.Context, j job) ([]build, error) {
	var bs []build
	table := keptTable(k.prefix, j.row.name, j.purge > 0)
	if size, ok := k.done[table]; !ok || size != j.fill || j.purge > 0 {
		b, err := fillKept(ctx, k.pool, table, j.row.name, j.fill)
		if err != nil {
			return nil, err
		}
		k.done[table] = j.fill
		if b != nil {
			fmt.Fprintf(os.Stderr, "built %s\n", b)
			bs = append(bs, *b)
		}
	}
	if j.purge > 0 {
		b, err := addExpired(ctx, k.pool, table, j.row.name, j.purge)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "built %s\n", b)
		bs = append(bs, *b)
	}
	return bs, nil
}
