package dedup

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The console's queries read the records through two indexes that
// [PostgresStore.CreateConsoleIndexes] adds on purpose, beside the primary
// key, so that none reads the whole table:
//
//   - <table>_console, a B-tree on (status, updated_at, scope, event_id) of
//     the rows that are not succeeded: the stuck and failed-final lists in
//     keyset order, the counts by status, the oldest record in flight and
//     the failures over time. Succeeded rows, the bulk of a table, are not
//     in it.
//   - <table>_created, a BRIN on created_at: the records written per
//     minute, read a range of blocks at a time.
//
// They are not made by [PostgresStore.Migrate], because every claim pays
// for them: the B-tree takes an entry per claim, and since it names the
// status, a completion can no longer update its row in place (a HOT
// update). A service that mounts the console creates them once.
const (
	consoleIndex = "_console"
	createdIndex = "_created"
	// exactBlocks is the size, in 8 kB blocks, up to which the console
	// counts succeeded records exactly; a larger table's are estimated.
	exactBlocks = 2048
)

// consoleSQL holds the console's statements, built for a store's table.
type consoleSQL struct {
	indexes                                  []string // CREATE INDEX statements
	invalid, missing                         string
	counts, oldest, size, succeeded, failure string
	written, failedFinal, stuck              string
}

func buildConsoleSQL(table string) consoleSQL {
	schema, bare := splitTable(table)
	qualified := func(suffix string) string {
		return schema + pgx.Identifier{identCut(bare, suffix)}.Sanitize()
	}
	index := func(suffix string) string { return pgx.Identifier{identCut(bare, suffix)}.Sanitize() }
	live := `expires_at > now() AND ($1 = '' OR scope = $1)`
	page := func(where string) string {
		return `(SELECT scope, event_id, ` + recordExprs + ` FROM ` + table + `
	WHERE ` + where + ` AND ` + live + ` AND ($2 = '' OR left(last_error, 80) = $2)
		AND (updated_at, scope, event_id) > ($3, $4, $5)
	ORDER BY updated_at, scope, event_id LIMIT $6)`
	}
	return consoleSQL{
		indexes: []string{
			`CREATE INDEX CONCURRENTLY IF NOT EXISTS ` + index(consoleIndex) + ` ON ` + table +
				` (status, updated_at, scope, event_id) WHERE status <> 2`,
			`CREATE INDEX CONCURRENTLY IF NOT EXISTS ` + index(createdIndex) + ` ON ` + table +
				` USING brin (created_at) WITH (pages_per_range = 32)`,
		},
		// An index a CREATE INDEX CONCURRENTLY left invalid (it was
		// interrupted) is dropped, to be built again.
		invalid: `SELECT indexrelid::regclass::text FROM pg_index
	WHERE indexrelid IN (to_regclass('` + qualified(consoleIndex) + `'), to_regclass('` + qualified(createdIndex) + `')) AND NOT indisvalid`,
		// The table's name, cast to regclass, fails with undefined_table
		// when the table is absent: no index is missing from no table.
		missing: `SELECT array_remove(ARRAY[
	CASE WHEN to_regclass('` + qualified(consoleIndex) + `') IS NULL THEN '` + index(consoleIndex) + `' END,
	CASE WHEN to_regclass('` + qualified(createdIndex) + `') IS NULL THEN '` + index(createdIndex) + `' END], NULL)
WHERE $1::regclass IS NOT NULL`,

		counts: `SELECT scope, status, count(*), count(*) FILTER (WHERE
	(status = 1 AND lease_until < now()) OR (status = 3 AND updated_at < now() - $2::interval))
FROM ` + table + ` WHERE status <> 2 AND ` + live + `
GROUP BY scope, status ORDER BY scope, status`,
		oldest: `SELECT scope, event_id, ` + recordExprs + ` FROM ` + table + `
WHERE status = 1 AND ` + live + ` ORDER BY updated_at LIMIT 1`,
		size: `SELECT now(), pg_relation_size($1::regclass) / current_setting('block_size')::bigint,
	greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = $1::regclass`,
		succeeded: `SELECT count(*) FROM ` + table + ` WHERE coalesce(status, 2) = 2 AND ` + live,
		failure: `SELECT date_trunc('minute', updated_at), left(last_error, 80), count(*) FROM ` + table + `
WHERE status IN (3, 4) AND updated_at > now() - $2::interval AND ` + live + `
GROUP BY 1, 2 ORDER BY 1, 2`,
		written: `SELECT date_trunc('minute', created_at), count(*) FROM ` + table + `
WHERE created_at > now() - $2::interval AND ` + live + `
GROUP BY 1 ORDER BY 1`,
		failedFinal: page(`status = 4`),
		// Two ranges of the console index, merged in keyset order.
		stuck: page(`status = 1 AND lease_until < now()`) + `
UNION ALL
` + page(`status = 3 AND updated_at < now() - $7::interval`) + `
ORDER BY updated_at, scope, event_id LIMIT $6`,
	}
}

// splitTable splits a sanitized table name into its schema, quoted and
// followed by a dot ("" when none), and its bare name, unquoted.
func splitTable(table string) (schema, bare string) {
	parts := strings.Split(table, `"."`)
	bare = strings.Trim(parts[len(parts)-1], `"`)
	if len(parts) > 1 {
		schema = parts[0] + `".`
	}
	return schema, bare
}

// CreateConsoleIndexes creates the two indexes the operator's console
// (package dedupui) reads the records through, <table>_console and
// <table>_created, if they do not exist, without locking the table against
// writes (CREATE INDEX CONCURRENTLY). They are not made by
// [PostgresStore.Migrate]: every claim pays for them (see
// docs/operations.md). It must not run in a transaction.
func (s *PostgresStore) CreateConsoleIndexes(ctx context.Context) error {
	if err := s.consoleLayout(ctx, "console indexes"); err != nil {
		return err
	}
	rows, err := s.pool.Query(ctx, s.console.invalid)
	if err != nil {
		return s.opError("console indexes", err)
	}
	invalid, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return s.opError("console indexes", err)
	}
	for _, idx := range invalid {
		if _, err := s.pool.Exec(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+idx); err != nil {
			return s.opError("console indexes", err)
		}
	}
	for _, stmt := range s.console.indexes {
		if _, err := s.pool.Exec(ctx, stmt); err != nil {
			return s.opError("console indexes", err)
		}
	}
	return nil
}

// MissingConsoleIndexes names the indexes of [PostgresStore.CreateConsoleIndexes]
// that the table lacks: without them the console's queries would read the
// whole table, so the console (package dedupui) runs none of them. Like
// the console's queries, it fails on an absent table (run Migrate) and on
// a table of record v1 ([ErrRecordV1]).
func (s *PostgresStore) MissingConsoleIndexes(ctx context.Context) ([]string, error) {
	if err := s.consoleLayout(ctx, "console indexes"); err != nil {
		return nil, err
	}
	var missing []string
	if err := s.pool.QueryRow(ctx, s.console.missing, s.table).Scan(&missing); err != nil {
		return nil, s.opError("console indexes", err)
	}
	return missing, nil
}

// Summary implements [Browser]; see [PostgresStore.CreateConsoleIndexes]
// for the indexes it reads. Succeeded records are counted exactly in a
// table of up to 16 MB and estimated in a larger one. While a migration
// from record v1 runs, it sees the rows moved so far.
func (s *PostgresStore) Summary(ctx context.Context, q SummaryQuery) (Summary, error) {
	if err := s.consoleLayout(ctx, "summary"); err != nil {
		return Summary{}, err
	}
	var sum Summary
	var blocks, estimate int64
	if err := s.pool.QueryRow(ctx, s.console.size, s.table).Scan(&sum.Now, &blocks, &estimate); err != nil {
		return Summary{}, s.opError("summary", err)
	}
	rows, err := s.pool.Query(ctx, s.console.counts, q.Scope, q.OlderThan)
	if err != nil {
		return Summary{}, s.opError("summary", err)
	}
	var scope string
	var status int16
	var n, stuck, counted int64
	_, err = pgx.ForEachRow(rows, []any{&scope, &status, &n, &stuck}, func() error {
		if len(sum.Scopes) == 0 || sum.Scopes[len(sum.Scopes)-1].Scope != scope {
			sum.Scopes = append(sum.Scopes, ScopeCounts{Scope: scope})
		}
		c := &sum.Scopes[len(sum.Scopes)-1]
		switch status {
		case pgProcessing:
			c.Processing = n
		case pgRetryable:
			c.Retryable = n
		case pgFinal:
			c.Final = n
		}
		c.Stuck += stuck
		counted += n
		return nil
	})
	if err != nil {
		return Summary{}, s.opError("summary", err)
	}
	if blocks <= exactBlocks {
		err = s.pool.QueryRow(ctx, s.console.succeeded, q.Scope).Scan(&sum.Succeeded)
	} else {
		sum.Succeeded, sum.SucceededEstimated = max(estimate-counted, 0), true
	}
	if err != nil {
		return Summary{}, s.opError("summary", err)
	}
	oldest, err := s.records(ctx, "summary", s.console.oldest, q.Scope)
	if err != nil {
		return Summary{}, err
	}
	if len(oldest) == 1 {
		sum.OldestInFlight = &oldest[0]
	}
	if sum.Failures, err = collect(ctx, s, s.console.failure, q, func(r *ReasonCount) []any { return []any{&r.Minute, &r.Reason, &r.Count} }); err != nil {
		return Summary{}, err
	}
	if sum.Written, err = collect(ctx, s, s.console.written, q, func(m *MinuteCount) []any { return []any{&m.Minute, &m.Count} }); err != nil {
		return Summary{}, err
	}
	return sum, nil
}

// collect runs one of the summary's charts, scanning each row into a T
// through the targets fields returns.
func collect[T any](ctx context.Context, s *PostgresStore, sql string, q SummaryQuery, fields func(*T) []any) ([]T, error) {
	rows, err := s.pool.Query(ctx, sql, q.Scope, q.Window)
	if err != nil {
		return nil, s.opError("summary", err)
	}
	var out []T
	var v T
	_, err = pgx.ForEachRow(rows, fields(&v), func() error {
		out = append(out, v)
		return nil
	})
	if err != nil {
		return nil, s.opError("summary", err)
	}
	return out, nil
}

// Browse implements [Browser]: one range of the console index (two for
// ListStuck), read in keyset order from the cursor.
func (s *PostgresStore) Browse(ctx context.Context, q BrowseQuery) ([]Record, error) {
	if err := q.validate(); err != nil {
		return nil, err
	}
	if err := s.consoleLayout(ctx, "browse"); err != nil {
		return nil, err
	}
	at, after := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, Key{}
	if q.After != nil {
		at, after = pgtype.Timestamptz{Time: q.After.UpdatedAt, Valid: true}, q.After.Key
	}
	args := []any{q.Scope, q.Reason, at, after.Scope, after.EventID, q.Limit}
	sql := s.console.failedFinal
	if q.List == ListStuck {
		sql, args = s.console.stuck, append(args, q.OlderThan)
	}
	return s.records(ctx, "browse", sql, args...)
}

// consoleLayout refuses a table of record v1 with [ErrRecordV1]: the
// console reads the v2 layout, and while a migration from v1 runs, the
// rows moved so far.
func (s *PostgresStore) consoleLayout(ctx context.Context, op string) error {
	if _, err := s.migrating(ctx, s.pool); err != nil {
		return s.opError(op, err)
	}
	return nil
}

// records runs a query of scope, event_id and the record columns and
// decodes its rows.
func (s *PostgresStore) records(ctx context.Context, op, sql string, args ...any) ([]Record, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, s.opError(op, err)
	}
	var out []Record
	var r pgRecord
	var key Key
	_, err = pgx.ForEachRow(rows, r.targets(&key.Scope, &key.EventID), func() error {
		rec, err := r.decode(key)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		out = append(out, rec)
		r = pgRecord{}
		return nil
	})
	if err != nil {
		return nil, s.opError(op, scanError(err))
	}
	return out, nil
}

var _ Browser = (*PostgresStore)(nil)
