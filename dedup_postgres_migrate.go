package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// MigrationPlan is what [PostgresStore.Migrate] would do to the store's
// table as it is now.
type MigrationPlan struct {
	// Table is the table's quoted name.
	Table string
	// State is what the table is: "absent", "v1" (the layout before record
	// v2), "migrating" (v2, with rows left in the v1 table beside it) or "v2".
	State string
	// Steps are the statements Migrate runs, in order; none when State is
	// "v2".
	Steps []MigrationStep
}

// MigrationStep is one step of a [MigrationPlan].
type MigrationStep struct {
	// SQL is the statement, or the statements of one transaction; a
	// statement repeated over the table is shown once.
	SQL string
	// Rows estimates the rows the step touches (-1: unknown).
	Rows int64
	// Locks says which locks the step takes and for how long.
	Locks string
	// Note says what the step is for.
	Note string
}

// The table's states a migration passes through.
const (
	stateAbsent    = "absent"
	stateV1        = "v1"
	stateMigrating = "migrating"
	stateV2        = "v2"
)

// The layouts a store caches (PostgresStore.layout): once the table is v2
// it stays v2.
const (
	layoutUnknown int32 = iota
	layoutV2
	layoutMigrating
)

// migrationLockTimeout bounds how long a migration's statement that locks
// the whole table waits for the transactions using it; every other
// statement on the table queues behind it meanwhile. It is retried.
const migrationLockTimeout = "2s"

// migrationBlocks is how many heap blocks of the v1 table one statement of
// the copy moves: a few thousand rows.
const migrationBlocks = 128

// tableNames are the names a migration gives the v1 table it leaves beside
// a store's table.
type tableNames struct {
	v1     string // quoted, in the table's schema
	v1Bare string // quoted, unqualified, for RENAME TO
	pkey   string // quoted, unqualified: the v1 table's primary key once renamed
}

func newTableNames(ident pgx.Identifier) tableNames {
	v1 := identCut(ident[len(ident)-1], "_v1")
	return tableNames{
		v1:     append(append(pgx.Identifier{}, ident[:len(ident)-1]...), v1).Sanitize(),
		v1Bare: pgx.Identifier{v1}.Sanitize(),
		pkey:   pgx.Identifier{identCut(v1, "_pkey")}.Sanitize(),
	}
}

// identCut returns name with suffix, cut to PostgreSQL's 63 bytes; the
// name is ASCII, so cutting bytes is safe.
func identCut(name, suffix string) string {
	return name[:min(len(name), 63-len(suffix))] + suffix
}

// migrationSQL holds the statements of a migration from v1.
type migrationSQL struct {
	detect, pkeyName, indexes, estimate, blocks string
	rename, lockV1, drop                        string
	copyRange, copyRest, pull                   string
}

// v1Rows converts the rows of the v1 table that a CTE named old returned
// into record v2, as pgPack packs the fingerprint and owner.
func v1Rows() string {
	status := func(col string) string {
		return `CASE ` + col + ` WHEN 'PROCESSING' THEN 1 WHEN 'SUCCEEDED' THEN 2
	WHEN 'FAILED_RETRYABLE' THEN 3 WHEN 'FAILED_FINAL' THEN 4 END`
	}
	pack := func(col string, n int) string {
		return fmt.Sprintf(`CASE WHEN %[1]s ~ '^[0-9a-f]{%[2]d}$' AND left(%[1]s, 2) <> '00'
	THEN decode(%[1]s, 'hex') ELSE '\x00'::bytea || convert_to(%[1]s, 'UTF8') END`, col, 2*n)
	}
	return `(expires_at, scope, event_id, fingerprint, status, attempts, owner, lease_until, created_at,
	updated_at, last_error, first_failure, last_failure, result, previous_status)
SELECT o.expires_at, o.scope, o.event_id, ` + pack("o.fingerprint", fingerprintBytes) + `,
	` + status("o.status") + `, o.attempts, ` + pack("o.owner", ownerBytes) + `, o.lease_until, o.created_at,
	o.updated_at, o.last_error, o.first_failure, o.last_failure, o.result, ` + status("o.previous_status") + `
FROM old AS o
ON CONFLICT (scope, event_id) DO NOTHING`
}

func buildMigrationSQL(table string, names tableNames) migrationSQL {
	v1 := names.v1
	moveInto := `, ins AS (INSERT INTO ` + table + ` ` + v1Rows() + `)
SELECT count(*) FROM old`
	return migrationSQL{
		// The fingerprint's type tells the layouts apart: text in v1,
		// bytea in v2.
		detect: `SELECT (SELECT format_type(a.atttypid, NULL) FROM pg_attribute a
	WHERE a.attrelid = to_regclass($1) AND a.attname = 'fingerprint' AND NOT a.attisdropped),
	to_regclass($2) IS NOT NULL`,
		pkeyName: `SELECT quote_ident(conname) FROM pg_constraint WHERE conrelid = to_regclass($1) AND contype = 'p'`,
		indexes:  `SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = to_regclass($1) AND NOT indisprimary`,
		estimate: `SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass($1)`,
		blocks:   `SELECT pg_relation_size(to_regclass($1)) / current_setting('block_size')::bigint`,
		rename:   `ALTER TABLE ` + table + ` RENAME TO ` + names.v1Bare,
		lockV1:   `LOCK TABLE ` + v1 + ` IN ACCESS EXCLUSIVE MODE`,
		drop:     `DROP TABLE ` + v1,
		// The copy skips rows an operation is moving itself (a pull), so
		// that it never waits on one: the next pass takes what it skipped.
		copyRange: `WITH old AS (DELETE FROM ` + v1 + ` WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM ` + v1 + ` WHERE ctid >= $1 AND ctid < $2 FOR UPDATE SKIP LOCKED))
	RETURNING *)` + moveInto,
		copyRest: `WITH old AS (DELETE FROM ` + v1 + ` RETURNING *)` + moveInto,
		// Each key is looked up on its own, as in readBatch, so that a pull
		// costs a primary-key probe per key whatever the planner estimates
		// of a table nobody analyzed. Keys come sorted, so that pulls lock
		// rows in one order.
		pull: `WITH old AS (DELETE FROM ` + v1 + ` AS v USING unnest(` + pgSplit("$1") + `, ` + pgSplit("$2") + `) AS r(scope, event_id)
	CROSS JOIN LATERAL (SELECT ctid AS tid FROM ` + v1 + ` WHERE scope = r.scope AND event_id = r.event_id LIMIT 1) AS k
	WHERE v.ctid = k.tid
	RETURNING v.*)` + moveInto,
	}
}

// ErrRecordV1 reports that a store's table is in the layout before record
// v2 and no migration is under way: run [PostgresStore.Migrate] (or
// `dedup migrate`). It matches [ErrConfig].
var ErrRecordV1 = fmt.Errorf("%w: the table is record v1: run Migrate (dedup migrate) to move it to v2", ErrConfig)

// state reads what the table is now.
func (s *PostgresStore) state(ctx context.Context, q pgQuerier) (string, error) {
	var fp pgtype.Text
	var v1 bool
	if err := q.QueryRow(ctx, s.sql.migration.detect, s.table, s.names.v1).Scan(&fp, &v1); err != nil {
		return "", err
	}
	switch {
	case fp.String == "text" && v1:
		return "", fmt.Errorf("%w: both %s (v1) and %s exist: keep one", ErrConfig, s.table, s.names.v1)
	case fp.String == "text":
		return stateV1, nil
	case v1:
		return stateMigrating, nil
	case fp.Valid:
		return stateV2, nil
	}
	return stateAbsent, nil
}

// migrating reports whether the table is being migrated from v1, reading
// the catalog through q until the table is found in a layout that stays.
func (s *PostgresStore) migrating(ctx context.Context, q pgQuerier) (bool, error) {
	switch s.layout.Load() {
	case layoutV2:
		return false, nil
	case layoutMigrating:
		return true, nil
	}
	state, err := s.state(ctx, q)
	switch {
	case err != nil:
		return false, err
	case state == stateV1:
		return false, fmt.Errorf("%s: %w", s.table, ErrRecordV1)
	case state == stateMigrating:
		s.layout.Store(layoutMigrating)
		return true, nil
	case state == stateV2:
		s.layout.Store(layoutV2)
	}
	// Absent: the statements say to run Migrate.
	return false, nil
}

// pullKey moves the v1 row of key into the table while a migration runs,
// in tx (nil: on the pool).
func (s *PostgresStore) pullKey(ctx context.Context, tx pgx.Tx, key Key) error {
	if s.layout.Load() == layoutV2 {
		return nil
	}
	return s.pull(ctx, tx, []byte(key.Scope), []byte(key.EventID))
}

// pull moves the v1 rows of the keys in lists scopes and ids (pgList, in
// key order) into the table while a migration runs, each in the statement
// that deletes it from the v1 table: a row is in one table or the other,
// and a key's operations after its pull find it in v2. In a transaction
// (tx not nil) the pull commits or vanishes with it, under a savepoint, so
// that the v1 table dropped meanwhile does not abort tx: an inbox attempt
// holding a connection never waits for another one.
func (s *PostgresStore) pull(ctx context.Context, tx pgx.Tx, scopes, ids []byte) error {
	var q pgQuerier = s.pool
	if tx != nil {
		q = tx
	}
	if m, err := s.migrating(ctx, q); err != nil || !m {
		return err
	}
	var err error
	if tx == nil {
		_, err = s.pool.Exec(ctx, s.sql.migration.pull, scopes, ids)
	} else {
		err = pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			_, err := sp.Exec(ctx, s.sql.migration.pull, scopes, ids)
			return err
		})
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // the migration dropped the v1 table
		s.layout.Store(layoutV2)
		return nil
	}
	return err
}

// Migrate creates the table unless it exists, or brings a table of record
// v1 to v2 without stopping the consumers that use it.
//
// A v1 table is renamed <table>_v1 and an empty v2 table created in its
// place in one short transaction, which waits at most 2 s for the
// transactions using the table (and is retried). Until the copy is done,
// every operation of a store first moves its keys' rows across, so each
// record of every state is honoured: a v1 duplicate stays a duplicate, a
// v1 lease stays fenced on its owner. Migrate then moves the rest, a range
// of blocks per transaction, and drops <table>_v1.
//
// It is idempotent, safe to run from several processes at once (they take
// turns), and resumable: every step is a committed transaction, so a
// Migrate killed at any point is finished by the next. Processes running a
// version of this package before record v2 fail their statements once the
// table is renamed (they never process an event twice): upgrade them
// first. [PostgresStore.MigrationPlan] says what Migrate would do.
func (s *PostgresStore) Migrate(ctx context.Context) error {
	for {
		done, err := s.migrateStep(ctx)
		if err != nil {
			if retryableMigration(err) && ctx.Err() == nil {
				if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
					return fmt.Errorf("dedup: postgres migrate %s: %w", s.table, err)
				}
				continue
			}
			return fmt.Errorf("dedup: postgres migrate %s: %w", s.table, err)
		}
		if done {
			return nil
		}
	}
}

// retryableMigration reports whether a migration step failed for a lock it
// could not take in time or a deadlock: the step is tried again.
func retryableMigration(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "40P01")
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// migrateStep takes the migration one committed step further, and reports
// whether it is done.
func (s *PostgresStore) migrateStep(ctx context.Context) (done bool, err error) {
	state, err := s.lockedState(ctx)
	if err != nil {
		return false, err
	}
	switch state {
	case stateV2:
		s.layout.Store(layoutV2)
		return true, nil
	case stateAbsent:
		err := s.inMigration(ctx, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, s.sql.createTable)
			return err
		})
		if err == nil {
			s.layout.Store(layoutV2)
		}
		return true, err
	case stateV1:
		return false, s.inMigration(ctx, func(tx pgx.Tx) error { return s.switchToV2(ctx, tx) })
	}
	s.layout.Store(layoutMigrating)
	moved, gone, err := s.copyPass(ctx)
	if err != nil || gone || moved > 0 {
		return false, err // the next step reads the state again
	}
	return false, s.inMigration(ctx, func(tx pgx.Tx) error { return s.dropV1(ctx, tx) })
}

// lockedState reads the table's state under the migration's lock.
func (s *PostgresStore) lockedState(ctx context.Context) (state string, err error) {
	err = s.inMigration(ctx, func(tx pgx.Tx) error {
		state, err = s.state(ctx, tx)
		return err
	})
	return state, err
}

// inMigration runs f in a transaction holding the table's migration lock,
// so that the steps of concurrent migrations take turns, and the state f
// reads is the state it changes.
func (s *PostgresStore) inMigration(ctx context.Context, f func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.sql.migrateLock, "dedup migrate "+s.table); err != nil {
			return err
		}
		return f(tx)
	})
}

// switchToV2 renames the v1 table and creates the v2 one in its place, in
// tx. The v1 table's primary key is renamed with it (the new table's takes
// its name), and its other indexes are dropped: nothing reads them again.
func (s *PostgresStore) switchToV2(ctx context.Context, tx pgx.Tx) error {
	if state, err := s.state(ctx, tx); err != nil || state != stateV1 {
		return err // another migration switched it meanwhile
	}
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '`+migrationLockTimeout+`'`); err != nil {
		return err
	}
	var pkey string
	if err := tx.QueryRow(ctx, s.sql.migration.pkeyName, s.table).Scan(&pkey); err != nil {
		return fmt.Errorf("the v1 table's primary key: %w", err)
	}
	indexes, err := queryStrings(ctx, tx, s.sql.migration.indexes, s.table)
	if err != nil {
		return err
	}
	stmts := []string{s.sql.migration.rename, `ALTER TABLE ` + s.names.v1 + ` RENAME CONSTRAINT ` + pkey + ` TO ` + s.names.pkey}
	for _, idx := range indexes {
		stmts = append(stmts, `DROP INDEX `+idx)
	}
	stmts = append(stmts, s.sql.createTable)
	for _, stmt := range stmts {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

func queryStrings(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, sql string, args ...any) ([]string, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// copyPass moves the v1 table's rows across once, a range of blocks per
// transaction, and returns how many it moved. A pass stops where another
// migration finished meanwhile (gone reports it).
func (s *PostgresStore) copyPass(ctx context.Context) (moved int64, gone bool, err error) {
	for b, blocks := int64(0), int64(1); b < blocks; b += migrationBlocks {
		err := s.inMigration(ctx, func(tx pgx.Tx) error {
			state, err := s.state(ctx, tx)
			if err != nil || state != stateMigrating {
				gone = true
				return err
			}
			if b == 0 {
				if err := tx.QueryRow(ctx, s.sql.migration.blocks, s.names.v1).Scan(&blocks); err != nil {
					return err
				}
			}
			var n int64
			err = tx.QueryRow(ctx, s.sql.migration.copyRange, blockStart(b), blockStart(b+migrationBlocks)).Scan(&n)
			moved += n
			return err
		})
		if err != nil || gone {
			return moved, gone, err
		}
	}
	return moved, false, nil
}

// dropV1 moves what is left in the v1 table and drops it, in tx, once no
// operation uses it.
func (s *PostgresStore) dropV1(ctx context.Context, tx pgx.Tx) error {
	if state, err := s.state(ctx, tx); err != nil || state != stateMigrating {
		return err // another migration dropped it meanwhile
	}
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '`+migrationLockTimeout+`'`); err != nil {
		return err
	}
	for _, stmt := range []string{s.sql.migration.lockV1, s.sql.migration.copyRest, s.sql.migration.drop} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return err
		}
	}
	s.layout.Store(layoutV2)
	return nil
}

// MigrationPlan says what [PostgresStore.Migrate] would do to the table as
// it is now, with estimates of the rows each step touches. It changes
// nothing.
func (s *PostgresStore) MigrationPlan(ctx context.Context) (MigrationPlan, error) {
	state, err := s.state(ctx, s.pool)
	if err != nil {
		return MigrationPlan{}, fmt.Errorf("dedup: postgres migration plan %s: %w", s.table, err)
	}
	p := MigrationPlan{Table: s.table, State: state}
	// A table never analyzed has no estimate (-1): it is counted.
	estimate := func(table string) int64 {
		var n int64 = -1
		if err := s.pool.QueryRow(ctx, s.sql.migration.estimate, table).Scan(&n); err == nil && n < 0 {
			_ = s.pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n)
		}
		return n
	}
	copySteps := func(rows int64) []MigrationStep {
		return []MigrationStep{{
			SQL:   s.sql.migration.copyRange,
			Rows:  rows,
			Locks: "ROW EXCLUSIVE on both tables; row locks on one range of " + fmt.Sprint(migrationBlocks) + " blocks a transaction (rows an operation is moving are skipped, then taken by the next pass)",
			Note:  "moves the v1 rows across, repeated over the v1 table until a pass moves none; operations move their own keys' rows first meanwhile",
		}, {
			SQL:   s.sql.migration.lockV1 + ";\n" + s.sql.migration.copyRest + ";\n" + s.sql.migration.drop,
			Rows:  0,
			Locks: "ACCESS EXCLUSIVE on " + s.names.v1 + " (lock_timeout " + migrationLockTimeout + ", retried); nothing but a pull reads it by then",
			Note:  "moves whatever a rolled-back operation put back, and drops the v1 table",
		}}
	}
	switch state {
	case stateAbsent:
		p.Steps = []MigrationStep{{SQL: s.sql.createTable, Rows: 0, Locks: "none on existing tables", Note: "creates the v2 table"}}
	case stateV1:
		p.Steps = append([]MigrationStep{{
			SQL: s.sql.migration.rename + ";\nALTER TABLE " + s.names.v1 + " RENAME CONSTRAINT <its primary key> TO " + s.names.pkey +
				";\nDROP INDEX <its other indexes>;\n" + s.sql.createTable,
			Rows:  0,
			Locks: "ACCESS EXCLUSIVE on " + s.table + " for the length of one catalog transaction (lock_timeout " + migrationLockTimeout + ", retried); statements on the table queue behind it meanwhile",
			Note:  "renames the v1 table " + s.names.v1 + " and creates the v2 table in its place; from here, processes of the version before record v2 fail their statements (never process twice)",
		}}, copySteps(estimate(s.table))...)
	case stateMigrating:
		p.Steps = copySteps(estimate(s.names.v1))
	}
	return p, nil
}
