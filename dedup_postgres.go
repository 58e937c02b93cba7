package dedup

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/pgident"
)

// inboxSavepoint is the savepoint an inbox attempt takes after its claim.
const inboxSavepoint = "dedup_attempt"

// PostgresStore is a [Store] kept in one PostgreSQL table, in the layout
// of record v2 (docs/record-v2.md).
//
// Each record is written twice in quick succession, claimed then settled. So
// that the second write is an in-place (HOT) update, the table Migrate
// creates keeps half of each page free (fillfactor 50). A row the
// transactional inbox commits holds four columns: the key, the payload's
// fingerprint and the expiry; its transaction's row lock was its lease.
//
// The table has no index on the expiry: [PostgresStore.Purge] sweeps the
// heap a range of blocks at a time (PostgreSQL 14 or later reads a range
// directly; before, each range costs a scan).
//
// The key columns compare bytes (COLLATE "C"): each event costs several
// lookups in the primary key, and a key is an identifier, not text to sort
// for people.
type PostgresStore struct {
	pool *pgxpool.Pool
	// txConns begins the transactional inbox's transactions on pool, at
	// most its bound at once (WithTxConns).
	txConns *txBudget
	table   string // quoted, for messages
	sql     postgresSQL
	console consoleSQL // the operator's console's (admin_browse_postgres.go)
	// layout is what the table was last found to be (a pgLayout): v2, or
	// being migrated from v1, when each operation first moves its keys'
	// rows across.
	layout atomic.Int32
	names  tableNames
}

// TableNameError reports a table name [NewPostgresStore] or the outbox
// refused to use. It matches [ErrConfig].
type TableNameError struct {
	Name   string
	Reason string
}

func (e *TableNameError) Error() string {
	return fmt.Sprintf("dedup: table name %q: %s", e.Name, e.Reason)
}

// Unwrap returns [ErrConfig].
func (e *TableNameError) Unwrap() error { return ErrConfig }

// NewPostgresStore returns a store on pool; call [PostgresStore.Migrate] once
// to create its table. Its options are [WithTable] and [WithTxConns].
func NewPostgresStore(pool *pgxpool.Pool, opts ...StoreOpt) (*PostgresStore, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: postgres store: nil pool", ErrConfig)
	}
	cfg := storeOptions(opts)
	ident, err := parseTableName(cfg.table)
	if err != nil {
		return nil, err
	}
	budget, err := newTxBudget(pool, cfg)
	if err != nil {
		return nil, err
	}
	s := &PostgresStore{pool: pool, txConns: budget, table: ident.Sanitize(), names: newTableNames(ident)}
	s.sql = buildPostgresSQL(s.table, s.names)
	s.console = buildConsoleSQL(s.table)
	return s, nil
}

// parseTableName splits name into at most a schema and a table, each a plain
// SQL identifier, so that nothing but a name can reach the SQL text.
func parseTableName(name string) (pgx.Identifier, error) {
	ident, reason := pgident.Parse(name)
	if reason != "" {
		return nil, &TableNameError{Name: name, Reason: reason}
	}
	return ident, nil
}

// postgresSQL holds every statement of a store, built once for its table.
type postgresSQL struct {
	createTable, migrateLock                    string
	claim, claimBatch, claimInTx, recordFailure string
	takeoverBatch, takeoverInTx                 string
	claimBatchInTx, takeoverBatchInTx           string
	savepoint, rollbackToSavepoint, failInTx    string
	leaseInTx, resultInTx                       string
	read, readBatch, get                        string
	complete, completeBatch, completeLocated    string
	fail, extend, release, purge, relBlocks     string
	stuck, forget                               string
	migration                                   migrationSQL
}

// The status codes of record v2. A row the transactional inbox commits
// has none (NULL), which reads as pgSucceeded.
const (
	pgProcessing = 1
	pgSucceeded  = 2
	pgRetryable  = 3
	pgFinal      = 4
)

var pgStatuses = [...]Status{pgProcessing: StatusProcessing, pgSucceeded: StatusSucceeded,
	pgRetryable: StatusFailedRetryable, pgFinal: StatusFailedFinal}

// recordExprs reads the record columns as pgRecord.targets scans them, in
// this order: the defaults of an inbox row filled in, the packed columns
// as hex. recordNames names them.
const (
	recordExprs = `coalesce(status, 2) AS status, encode(fingerprint, 'hex') AS fingerprint,
	coalesce(attempts, 1) AS attempts, encode(owner, 'hex') AS owner, lease_until, created_at,
	updated_at, expires_at, last_error, first_failure, last_failure, result`
	recordNames = `status, fingerprint, attempts, owner, lease_until, created_at,
	updated_at, expires_at, last_error, first_failure, last_failure, result`
)

// takeoverSet applies a claim to an existing row: an expired row starts
// afresh, a taken-over row counts one more attempt. previous_status keeps the
// status the row had, because RETURNING only sees the new row.
const takeoverSet = `status = EXCLUDED.status,
	fingerprint = EXCLUDED.fingerprint,
	attempts = CASE WHEN t.expires_at <= now() THEN 1 ELSE coalesce(t.attempts, 1) + 1 END,
	owner = EXCLUDED.owner,
	lease_until = EXCLUDED.lease_until,
	created_at = CASE WHEN t.expires_at <= now() THEN EXCLUDED.created_at
		ELSE coalesce(t.created_at, EXCLUDED.created_at) END,
	updated_at = EXCLUDED.updated_at,
	expires_at = EXCLUDED.expires_at,
	last_error = CASE WHEN t.expires_at <= now() THEN NULL ELSE t.last_error END,
	first_failure = CASE WHEN t.expires_at <= now() THEN NULL ELSE t.first_failure END,
	last_failure = CASE WHEN t.expires_at <= now() THEN NULL ELSE t.last_failure END,
	result = CASE WHEN t.expires_at <= now() THEN NULL ELSE t.result END,
	previous_status = CASE WHEN t.expires_at <= now() THEN NULL ELSE coalesce(t.status, 2) END`

// takeoverAllowed is the state machine's takeover rule for row t claimed
// with fingerprint fp (an SQL expression of bytea): MayTakeOver in SQL,
// with expiry.
func takeoverAllowed(fp string) string {
	return `t.expires_at <= now() OR (t.fingerprint = ` + fp + ` AND
	(t.status = 3 OR (t.status = 1 AND t.lease_until <= now())))`
}

// The columns a claim writes: all of a store claim's, or the inbox's four.
const (
	claimColumns = `(expires_at, scope, event_id, fingerprint, status, attempts, owner, lease_until,
	created_at, updated_at)`
	inboxColumns = `(expires_at, scope, event_id, fingerprint)`
)

// batchRows is the FROM of a batch claim: its requests as lists (see pgList);
// the fingerprints, which may hold anything, come as an array ($3) when
// they cannot be a list. They are packed as hex (see pgPack).
func batchRows() string {
	return `unnest(` + pgSplit("$1") + `, ` + pgSplit("$2") + `, coalesce($3::text[], ` + pgSplit("$4") + `), ` + pgSplit("$5") + `,
	` + pgSplit("$6") + `::bigint[], ` + pgSplit("$7") + `::bigint[])
	AS r(scope, event_id, fingerprint, owner, lease_us, expiry_us)`
}

// claimBatchSQL is the statement that claims a list of keys no row holds,
// writing a claim in progress (inbox false) or the inbox's row, succeeded
// once its transaction commits (inbox true). A key a row holds is left for
// takeoverBatchSQL, after its row was read. The inbox's takes only the
// lists it writes (inboxRows) and returns only the keys and expiries: its
// rows have no place a completion would look them up by.
func claimBatchSQL(table string, inbox bool) string {
	if inbox {
		return `INSERT INTO ` + table + ` ` + inboxColumns + `
SELECT now() + r.expiry_us * interval '1 microsecond', r.scope, r.event_id, decode(r.fingerprint, 'hex')
FROM unnest(` + pgSplit("$1") + `, ` + pgSplit("$2") + `, coalesce($3::text[], ` + pgSplit("$4") + `), ` + pgSplit("$5") + `::bigint[])
	AS r(scope, event_id, fingerprint, expiry_us)
ON CONFLICT (scope, event_id) DO NOTHING
RETURNING scope, event_id, expires_at`
	}
	return `INSERT INTO ` + table + ` ` + claimColumns + `
SELECT now() + r.expiry_us * interval '1 microsecond', r.scope, r.event_id, decode(r.fingerprint, 'hex'), 1, 1,
	decode(r.owner, 'hex'), now() + r.lease_us * interval '1 microsecond', now(), now()
FROM ` + batchRows() + `
ON CONFLICT (scope, event_id) DO NOTHING
RETURNING scope, event_id, ctid, now(), expires_at`
}

// takeoverBatchSQL is the statement that takes over the rows of keys a
// claim found held and the rule lets go.
func takeoverBatchSQL(table string, inbox bool) string {
	status, owner, lease, at := "1", "decode(r.owner, 'hex')", "now() + r.lease_us * interval '1 microsecond'", "now()"
	if inbox {
		status, owner, lease, at = "NULL::smallint", "NULL::bytea", "NULL::timestamptz", "NULL::timestamptz"
	}
	return `INSERT INTO ` + table + ` AS t ` + claimColumns + `
SELECT now() + r.expiry_us * interval '1 microsecond', r.scope, r.event_id, decode(r.fingerprint, 'hex'),
	` + status + `, 1, ` + owner + `, ` + lease + `, ` + at + `, ` + at + `
FROM ` + batchRows() + `
ON CONFLICT (scope, event_id) DO UPDATE SET ` + takeoverSet + `
WHERE ` + takeoverAllowed("EXCLUDED.fingerprint") + `
RETURNING t.scope, t.event_id, ctid, now(), previous_status, ` + recordExprs
}

func buildPostgresSQL(table string, names tableNames) postgresSQL {
	where := `WHERE scope = $1 AND event_id = $2`
	held := where + ` AND owner = decode($3, 'hex') AND status = 1 AND expires_at > now()`
	return postgresSQL{
		migrateLock: `SELECT pg_advisory_xact_lock(hashtext($1))`,
		// Columns are ordered so that a row pads least: the 8-byte expiry
		// first, what an inbox row leaves NULL (which costs a bit in the
		// row's null bitmap) after the four it writes.
		createTable: `CREATE TABLE IF NOT EXISTS ` + table + ` (
	expires_at timestamptz NOT NULL,
	scope text COLLATE "C" NOT NULL,
	event_id text COLLATE "C" NOT NULL,
	fingerprint bytea NOT NULL,
	status smallint CONSTRAINT dedup_status_check CHECK (status BETWEEN 1 AND 4),
	attempts integer,
	owner bytea,
	lease_until timestamptz,
	created_at timestamptz,
	updated_at timestamptz,
	last_error text,
	first_failure timestamptz,
	last_failure timestamptz,
	result bytea,
	previous_status smallint,
	PRIMARY KEY (scope, event_id)
) WITH (fillfactor = 50)`,

		// A live row the claim may not take over (a duplicate, an event in
		// flight) is answered from the statement's own read (cur): one round
		// trip, and no row lock, which a refused upsert would take and make
		// the autocommit wait for a WAL flush. A row written after the
		// statement's snapshot is refused by the upsert instead, which then
		// returns nothing, and the caller reads it.
		claim: `WITH cur AS (
	SELECT ` + recordExprs + ` FROM ` + table + ` AS t ` + where + `
	AND NOT coalesce(` + takeoverAllowed("decode($3, 'hex')") + `, false)
), ins AS (
	INSERT INTO ` + table + ` AS t ` + claimColumns + `
	SELECT now() + $6::interval, $1, $2, decode($3, 'hex'), 1, 1, decode($4, 'hex'), now() + $5::interval, now(), now()
	WHERE NOT EXISTS (SELECT FROM cur)
	ON CONFLICT (scope, event_id) DO UPDATE SET ` + takeoverSet + `
	WHERE ` + takeoverAllowed("EXCLUDED.fingerprint") + `
	RETURNING previous_status, ` + recordExprs + `
)
SELECT true, previous_status, ` + recordNames + ` FROM ins
UNION ALL
SELECT false, NULL, ` + recordNames + ` FROM cur`,

		// Rows are inserted in array order; callers sort the keys so that
		// concurrent batches lock rows in one order and cannot deadlock.
		claimBatch:        claimBatchSQL(table, false),
		takeoverBatch:     takeoverBatchSQL(table, false),
		claimBatchInTx:    claimBatchSQL(table, true),
		takeoverBatchInTx: takeoverBatchSQL(table, true),

		// The inbox's claim writes four columns; a key a row holds is
		// taken over, when the rule lets it, by takeoverInTx.
		claimInTx: `INSERT INTO ` + table + ` ` + inboxColumns + `
VALUES (now() + $4::interval, $1, $2, decode($3, 'hex'))
ON CONFLICT (scope, event_id) DO NOTHING
RETURNING expires_at`,
		takeoverInTx: `INSERT INTO ` + table + ` AS t ` + inboxColumns + `
VALUES (now() + $4::interval, $1, $2, decode($3, 'hex'))
ON CONFLICT (scope, event_id) DO UPDATE SET ` + takeoverSet + `
WHERE ` + takeoverAllowed("EXCLUDED.fingerprint") + `
RETURNING true, previous_status, ` + recordExprs,

		savepoint:           `SAVEPOINT ` + inboxSavepoint,
		rollbackToSavepoint: `ROLLBACK TO SAVEPOINT ` + inboxSavepoint,
		// The claim in the same transaction wrote the row: it is there. The
		// failure writes the attempt's owner token, which an operator's
		// Forget names.
		failInTx: `UPDATE ` + table + ` SET status = $3, owner = decode($6, 'hex'), attempts = coalesce(attempts, 1),
	last_error = $4, first_failure = coalesce(first_failure, now()), last_failure = now(),
	created_at = coalesce(created_at, now()), updated_at = now(), expires_at = now() + $5::interval
` + where + ` RETURNING attempts`,

		// The claim in the same transaction wrote the row as succeeded; the
		// attempt's outcome will be written on the store claim path instead,
		// fenced on the claim's owner token.
		leaseInTx: `UPDATE ` + table + ` SET status = 1, owner = decode($4, 'hex'), attempts = coalesce(attempts, 1),
	lease_until = now() + $3::interval, created_at = coalesce(created_at, now()), updated_at = now() ` + where,
		// The transaction holds the row it claimed, which is an inbox row.
		resultInTx: `UPDATE ` + table + ` SET result = $3 ` + where + ` AND status IS NULL`,

		recordFailure: `INSERT INTO ` + table + ` AS t (expires_at, scope, event_id, fingerprint, status, attempts,
	owner, lease_until, created_at, updated_at, last_error, first_failure, last_failure)
VALUES (now() + $6::interval, $1, $2, decode($4, 'hex'), $3, 1, decode($5, 'hex'), now(), now(), now(), $7, now(), now())
ON CONFLICT (scope, event_id) DO UPDATE SET
	status = EXCLUDED.status,
	fingerprint = EXCLUDED.fingerprint,
	attempts = CASE WHEN t.expires_at <= now() THEN 1 ELSE coalesce(t.attempts, 1) + 1 END,
	owner = EXCLUDED.owner,
	lease_until = now(),
	created_at = CASE WHEN t.expires_at <= now() THEN now() ELSE coalesce(t.created_at, now()) END,
	updated_at = now(),
	expires_at = EXCLUDED.expires_at,
	last_error = EXCLUDED.last_error,
	first_failure = CASE WHEN t.expires_at <= now() THEN now() ELSE coalesce(t.first_failure, now()) END,
	last_failure = now(),
	result = NULL,
	previous_status = NULL
WHERE t.expires_at <= now() OR (t.fingerprint = EXCLUDED.fingerprint AND t.status IN (1, 3))
RETURNING attempts`,

		// read answers a refused claim: the row was there when it refused, so
		// it is read whatever its expiry by now.
		read: `SELECT ` + recordExprs + ` FROM ` + table + ` ` + where,
		// Each key is looked up on its own (LATERAL ... LIMIT 1), so that
		// whatever the planner estimates, a batch costs one primary-key
		// probe per key, never a scan of the table.
		readBatch: `SELECT r.i, now(), t.*
FROM unnest(` + pgSplit("$1") + `, ` + pgSplit("$2") + `) WITH ORDINALITY AS r(scope, event_id, i)
CROSS JOIN LATERAL (SELECT ` + recordExprs + ` FROM ` + table + `
	WHERE scope = r.scope AND event_id = r.event_id LIMIT 1) AS t`,
		get: `SELECT ` + recordExprs + ` FROM ` + table + ` ` + where + ` AND expires_at > now()`,

		complete: `UPDATE ` + table + ` SET status = 2, result = $4, updated_at = now(),
	expires_at = ` + keptExpiry("$5::interval", "$6::interval") + ` ` + held,
		// Rows a claim of this store just wrote are found by where it wrote
		// them (ctid): no index lookup. The list of places is computed
		// once (an InitPlan), so the planner, not knowing its length,
		// reads them directly rather than scanning the table. A row
		// updated since has moved and is left to completeBatch; one whose
		// lease ran out too, since a claim taking it over locks rows in key
		// order. Owner tokens are unique, so an owner found among the
		// batch's is the completion's own row. The owners are compared as
		// the list's text, which the planner folds into a constant array
		// that it looks rows up in by hash, not one by one.
		completeLocated: `UPDATE ` + table + ` SET status = 2, result = NULL, updated_at = now(),
	expires_at = ` + keptExpiry("$2::interval", "$3::interval") + `
WHERE ctid = ANY(ARRAY(SELECT unnest(` + pgSplit("$1") + `)::tid))
	AND encode(owner, 'hex') = ANY(` + pgSplit("$4") + `)
	AND status = 1 AND lease_until > now() AND expires_at > now()
RETURNING encode(owner, 'hex')`,
		// Each key is looked up on its own, as in readBatch, and its row
		// updated through the ctid found: rows are locked in the order of
		// the keys, which callers sort as for claimBatch. A row updated
		// meanwhile has another ctid and is left alone: it was taken over.
		// RETURNING names the completed requests by position.
		completeBatch: `UPDATE ` + table + ` AS t SET status = 2, result = r.result, updated_at = now(),
	expires_at = ` + keptExpiry("r.ttl_us * interval '1 microsecond'", "r.expiry_us * interval '1 microsecond'") + `
FROM unnest(` + pgSplit("$1") + `, ` + pgSplit("$2") + `, ` + pgSplit("$3") + `, $4::bytea[],
	` + pgSplit("$5") + `::bigint[], ` + pgSplit("$6") + `::bigint[]) WITH ORDINALITY
	AS r(scope, event_id, owner, result, ttl_us, expiry_us, i)
CROSS JOIN LATERAL (SELECT ctid AS tid FROM ` + table + `
	WHERE scope = r.scope AND event_id = r.event_id LIMIT 1) AS k
WHERE t.ctid = k.tid AND t.owner = decode(r.owner, 'hex') AND t.status = 1 AND t.expires_at > now()
RETURNING r.i`,
		fail: `UPDATE ` + table + ` SET status = $4, last_error = $5,
	first_failure = coalesce(first_failure, now()), last_failure = now(), updated_at = now(),
	expires_at = now() + $6::interval ` + held,
		extend: `UPDATE ` + table + ` SET lease_until = now() + $4::interval, updated_at = now() ` + held,
		release: `UPDATE ` + table + ` SET status = 3, attempts = attempts - 1,
	lease_until = now(), updated_at = now() ` + held,
		// Purge sweeps the heap a range of blocks at a time (a TID range
		// scan): no expiry index for every insert to pay for, and no
		// statement that holds many rows or a long transaction.
		purge:     `DELETE FROM ` + table + ` WHERE ctid >= $1 AND ctid < $2 AND expires_at <= now()`,
		relBlocks: `SELECT pg_relation_size($1::regclass) / current_setting('block_size')::bigint`,

		stuck: `SELECT scope, event_id, ` + recordExprs + ` FROM ` + table + `
WHERE ($1 = '' OR scope = $1) AND expires_at > now()
	AND ((status = 1 AND lease_until < now()) OR (status = 3 AND updated_at < now() - $2::interval))
ORDER BY updated_at LIMIT $3`,
		forget: `DELETE FROM ` + table + `
WHERE scope = $1 AND event_id = $2 AND owner = decode($3, 'hex') AND coalesce(status, 2) <> 2`,

		migration: buildMigrationSQL(table, names),
	}
}

// keptExpiry is the expiry a completion writes: the one the claim wrote when
// that is between ttl and expiry (ttl plus expirySlack) from now, else ttl
// from now. Leaving the indexed column unchanged lets PostgreSQL update the
// row in place (a HOT update: no new index entries).
func keptExpiry(ttl, expiry string) string {
	return `CASE WHEN expires_at BETWEEN now() + ` + ttl + ` AND now() + ` + expiry +
		` THEN expires_at ELSE now() + ` + ttl + ` END`
}

// expiryOf is how long a claim retains its record: ttl plus a slack of
// 1/64, so that a completion soon after it finds the expiry still good.
func expiryOf(ttl time.Duration) time.Duration { return ttl + ttl/64 }

// Claim atomically creates or takes over the record for req.Key in one
// statement, or reports why it cannot.
func (s *PostgresStore) Claim(ctx context.Context, req ClaimRequest) (Claim, error) {
	if err := req.Key.Validate(); err != nil {
		return Claim{}, fmt.Errorf("dedup: postgres claim: %w", err)
	}
	if err := s.pullKey(ctx, nil, req.Key); err != nil {
		return Claim{}, s.opError("claim "+req.Key.String(), err)
	}
	c, err := s.claim(ctx, s.pool, s.sql.claim, req, req.Key.Scope, req.Key.EventID, pgPack(req.Fingerprint, fingerprintBytes),
		pgPack(deduptype.NewOwnerToken(), ownerBytes), req.Lease, expiryOf(req.TTL))
	if err != nil {
		return Claim{}, s.opError("claim "+req.Key.String(), err)
	}
	return c, nil
}

// pgQuerier is what claim needs from a pool or a transaction.
type pgQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// claim runs the upsert and, when it returns no row, classifies the record
// that refused it. A record purged between the two statements gets the
// upsert one more try.
func (s *PostgresStore) claim(ctx context.Context, q pgQuerier, upsert string, req ClaimRequest, args ...any) (Claim, error) {
	for retried := false; ; retried = true {
		var r pgRecord
		var previous pgtype.Int2
		var won bool
		err := q.QueryRow(ctx, upsert, args...).Scan(r.targets(&won, &previous)...)
		if err == nil && won {
			return acquired(req.Key, &r, previous)
		}
		if err == nil { // refused, and the statement read the row
			rec, err := r.decode(req.Key)
			if err != nil {
				return Claim{}, err
			}
			return Claim{Status: deduptype.Classify(rec, req.Fingerprint), Record: rec}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return Claim{}, scanError(err)
		}
		rec, err := s.read(ctx, q, s.sql.read, req.Key)
		if errors.Is(err, pgx.ErrNoRows) && !retried {
			continue
		}
		if errors.Is(err, pgx.ErrNoRows) {
			return Claim{}, errors.New("record refused the claim, then vanished twice (concurrent purge)")
		}
		if err != nil {
			return Claim{}, err
		}
		return Claim{Status: deduptype.Classify(rec, req.Fingerprint), Record: rec}, nil
	}
}

func acquired(key Key, r *pgRecord, previous pgtype.Int2) (Claim, error) {
	rec, err := r.decode(key)
	if err != nil {
		return Claim{}, err
	}
	c := Claim{Status: ClaimAcquired, Record: rec}
	if previous.Valid {
		if c.Previous = pgStatusOf(previous.Int16); c.Previous == "" {
			return Claim{}, fmt.Errorf("%w: previous status %d", ErrMalformedRecord, previous.Int16)
		}
	}
	return c, nil
}

// pgStatusOf is the status of code, or "" when it is none.
func pgStatusOf(code int16) Status {
	if code < 1 || int(code) >= len(pgStatuses) {
		return ""
	}
	return pgStatuses[code]
}

func (s *PostgresStore) read(ctx context.Context, q pgQuerier, query string, key Key) (Record, error) {
	var r pgRecord
	if err := q.QueryRow(ctx, query, key.Scope, key.EventID).Scan(r.targets()...); err != nil {
		return Record{}, scanError(err)
	}
	return r.decode(key)
}

// Complete marks the record succeeded, keeping result, if owner still holds
// it; otherwise it returns ErrLeaseLost.
func (s *PostgresStore) Complete(ctx context.Context, key Key, owner string, result []byte, ttl time.Duration) error {
	return s.settle(ctx, "complete", key, s.sql.complete, key.Scope, key.EventID, pgPack(owner, ownerBytes), result, ttl, expiryOf(ttl))
}

// Fail records a failed attempt if owner still holds the record; otherwise
// it returns ErrLeaseLost.
func (s *PostgresStore) Fail(ctx context.Context, key Key, owner string, f Failure) error {
	return s.settle(ctx, "fail", key, s.sql.fail, key.Scope, key.EventID, pgPack(owner, ownerBytes), failStatus(f), f.Error, f.TTL)
}

// failStatus is the status code failure f leaves.
func failStatus(f Failure) int16 {
	if f.Final {
		return pgFinal
	}
	return pgRetryable
}

// Extend pushes the lease of a held record to lease from now, or returns
// ErrLeaseLost.
func (s *PostgresStore) Extend(ctx context.Context, key Key, owner string, lease time.Duration) error {
	return s.settle(ctx, "extend", key, s.sql.extend, key.Scope, key.EventID, pgPack(owner, ownerBytes), lease)
}

// Release gives back a claim whose handler never started: the record is
// claimable at once and the attempt is not counted.
func (s *PostgresStore) Release(ctx context.Context, key Key, owner string) error {
	return s.settle(ctx, "release", key, s.sql.release, key.Scope, key.EventID, pgPack(owner, ownerBytes))
}

// settle runs an update fenced on the owner token.
func (s *PostgresStore) settle(ctx context.Context, op string, key Key, query string, args ...any) error {
	if err := key.Validate(); err != nil {
		return fmt.Errorf("dedup: postgres %s: %w", op, err)
	}
	if err := s.pullKey(ctx, nil, key); err != nil {
		return s.opError(op+" "+key.String(), err)
	}
	tag, err := s.pool.Exec(ctx, query, args...)
	if err != nil {
		return s.opError(op+" "+key.String(), err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("dedup: postgres %s %s: %w", op, key, ErrLeaseLost)
	}
	return nil
}

// Get returns the live record for key, or ErrNotFound.
func (s *PostgresStore) Get(ctx context.Context, key Key) (Record, error) {
	if err := key.Validate(); err != nil {
		return Record{}, fmt.Errorf("dedup: postgres get: %w", err)
	}
	if err := s.pullKey(ctx, nil, key); err != nil {
		return Record{}, s.opError("get "+key.String(), err)
	}
	rec, err := s.read(ctx, s.pool, s.sql.get, key)
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, fmt.Errorf("dedup: postgres get %s: %w", key, ErrNotFound)
	}
	if err != nil {
		return Record{}, s.opError("get "+key.String(), err)
	}
	return rec, nil
}

// purgeBlocks is how many heap blocks one statement of Purge sweeps: a few
// thousand rows at most, so that purging never holds many row locks or one
// long transaction.
const purgeBlocks = 32

// purgeRest is how long Purge rests after each statement, in multiples of
// the statement's own time: a purge keeps the database busy a quarter of
// the time at most, so that on a small machine the consumers beside it
// keep most of their throughput.
const purgeRest = 3

// Purge deletes expired records, sweeping the table once a range of blocks
// per statement, and returns how many it removed. It paces itself (resting
// three times as long as each statement took), so that it takes at most a
// quarter of one core from the database and the consumers beside it; a
// pass over a table of ten million records takes a few minutes.
func (s *PostgresStore) Purge(ctx context.Context) (int, error) {
	var blocks int64
	if err := s.pool.QueryRow(ctx, s.sql.relBlocks, s.table).Scan(&blocks); err != nil {
		return 0, s.opError("purge", err)
	}
	total := 0
	for b := int64(0); b < blocks; b += purgeBlocks {
		start := time.Now()
		tag, err := s.pool.Exec(ctx, s.sql.purge, blockStart(b), blockStart(b+purgeBlocks))
		if err != nil {
			return total, s.opError("purge", err)
		}
		total += int(tag.RowsAffected())
		if err := sleepCtx(ctx, purgeRest*time.Since(start)); err != nil {
			return total, fmt.Errorf("dedup: postgres purge: %w", err)
		}
	}
	return total, nil
}

// blockStart is the first tuple place of heap block b.
func blockStart(b int64) pgtype.TID {
	return pgtype.TID{BlockNumber: uint32(min(b, math.MaxUint32)), Valid: true}
}

// claimInTx records req as succeeded inside the caller's transaction, for
// the transactional inbox: the record commits or vanishes with the handler's
// own writes. A concurrent claim of the same key waits for this transaction
// and then sees a duplicate (commit) or acquires the key itself (rollback).
// A key with no row costs one insert of four columns; a row is taken over,
// when the rule lets it, by a second statement. When the claim is acquired,
// the savepoint inboxSavepoint follows it, in the same round trip for a new
// key, so that a failed attempt can undo the handler's writes and still
// record its failure while the row stays locked.
func (s *PostgresStore) claimInTx(ctx context.Context, tx pgx.Tx, req ClaimRequest) (Claim, error) {
	if err := req.Key.Validate(); err != nil {
		return Claim{}, fmt.Errorf("dedup: postgres claim in tx: %w", err)
	}
	if err := s.pullKey(ctx, tx, req.Key); err != nil {
		return Claim{}, s.opError("claim in tx "+req.Key.String(), err)
	}
	args := []any{req.Key.Scope, req.Key.EventID, pgPack(req.Fingerprint, fingerprintBytes), expiryOf(req.TTL)}
	var b pgx.Batch
	b.Queue(s.sql.claimInTx, args...)
	b.Queue(s.sql.savepoint)
	br := tx.SendBatch(ctx, &b)
	var expires time.Time
	err := br.QueryRow().Scan(&expires)
	_, serr := br.Exec()
	if cerr := br.Close(); serr == nil {
		serr = cerr
	}
	var c Claim
	switch {
	case err == nil && serr == nil:
		c = Claim{Status: ClaimAcquired, Record: inboxRecord(req, expires)}
	case err == nil:
		err = serr
	case errors.Is(err, pgx.ErrNoRows):
		// A row holds the key: take it over if the rule lets it, then take
		// the savepoint again, after the takeover.
		c, err = s.claim(ctx, tx, s.sql.takeoverInTx, req, args...)
		if err == nil && c.Status == ClaimAcquired {
			c.Record.Owner = deduptype.NewOwnerToken()
			_, err = tx.Exec(ctx, s.sql.savepoint)
		}
	default:
		err = scanError(err)
	}
	if err != nil {
		return Claim{}, s.opError("claim in tx "+req.Key.String(), err)
	}
	return c, nil
}

// inboxRecord is the record an inbox claim of req wrote, expiring at
// expires. Its owner token names the attempt should its outcome be written
// on the store claim path (leaseInTx, failInTx); the row holds none.
func inboxRecord(req ClaimRequest, expires time.Time) Record {
	return Record{Key: req.Key, Status: StatusSucceeded, Fingerprint: req.Fingerprint, Attempts: 1,
		Owner: deduptype.NewOwnerToken(), ExpiresAt: expires}
}

// failInTx records a failed inbox attempt in its own transaction, after
// rolling back to the savepoint claimInTx took: the handler's writes vanish,
// the row stays locked, and the failure commits with the claim's attempt. It
// returns the attempts recorded.
func (s *PostgresStore) failInTx(ctx context.Context, tx pgx.Tx, key Key, owner string, f Failure) (int, error) {
	attempts, err := s.failInBatchTx(ctx, tx, key, owner, f, true)
	if err == nil {
		if err = tx.Commit(ctx); err != nil {
			err = s.opError("record failure "+key.String(), err)
		}
	}
	return attempts, err
}

// failInBatchTx records a failed attempt in tx, which stays open, after
// rolling tx back to its latest savepoint when rollback is set (the failed
// handler wrote after taking it). It returns the attempts recorded.
func (s *PostgresStore) failInBatchTx(ctx context.Context, tx pgx.Tx, key Key, owner string, f Failure, rollback bool) (int, error) {
	if rollback {
		if err := s.rollbackToClaim(ctx, tx, key); err != nil {
			return 0, err
		}
	}
	var attempts int
	err := tx.QueryRow(ctx, s.sql.failInTx, key.Scope, key.EventID, failStatus(f), f.Error, f.TTL,
		pgPack(owner, ownerBytes)).Scan(&attempts)
	if err != nil {
		return 0, s.opError("record failure "+key.String(), err)
	}
	return attempts, nil
}

// rollbackToClaim rolls tx back to the savepoint claimInTx took after
// claiming key: the writes since vanish, the record's row stays locked, and
// a transaction a failed statement aborted can be written in again. It is a
// statement of its own: one batched with the next would be prepared first,
// which an aborted transaction refuses (25P02).
func (s *PostgresStore) rollbackToClaim(ctx context.Context, tx pgx.Tx, key Key) error {
	if _, err := tx.Exec(ctx, s.sql.rollbackToSavepoint); err != nil {
		return s.opError("rollback to the claim "+key.String(), err)
	}
	return nil
}

// leaseInTx turns the record of key, which a claim in tx wrote as succeeded,
// into a claim in progress by owner with a lease, committed with tx: its
// outcome is then settled by fenced writes on owner.
func (s *PostgresStore) leaseInTx(ctx context.Context, tx pgx.Tx, key Key, owner string, lease time.Duration) error {
	if _, err := tx.Exec(ctx, s.sql.leaseInTx, key.Scope, key.EventID, lease, pgPack(owner, ownerBytes)); err != nil {
		return s.opError("lease in tx "+key.String(), err)
	}
	return nil
}

// recordFailure counts a failed inbox attempt whose transaction was lost
// before its failure was recorded in it, and returns the attempts so far. It
// returns ErrLeaseLost when the event was settled (succeeded or failed for
// good) meanwhile.
func (s *PostgresStore) recordFailure(ctx context.Context, req ClaimRequest, f Failure) (int, error) {
	if err := req.Key.Validate(); err != nil {
		return 0, fmt.Errorf("dedup: postgres record failure: %w", err)
	}
	if err := s.pullKey(ctx, nil, req.Key); err != nil {
		return 0, s.opError("record failure "+req.Key.String(), err)
	}
	var attempts int
	err := s.pool.QueryRow(ctx, s.sql.recordFailure, req.Key.Scope, req.Key.EventID, failStatus(f),
		pgPack(req.Fingerprint, fingerprintBytes), pgPack(deduptype.NewOwnerToken(), ownerBytes), f.TTL, f.Error).Scan(&attempts)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("dedup: postgres record failure %s: already settled: %w", req.Key, ErrLeaseLost)
	}
	if err != nil {
		return 0, s.opError("record failure "+req.Key.String(), err)
	}
	return attempts, nil
}

// opError wraps err with the operation, and with a hint when the table is
// missing.
func (s *PostgresStore) opError(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return fmt.Errorf("dedup: postgres %s: table %s does not exist (run Migrate): %w", op, s.table, err)
	}
	return fmt.Errorf("dedup: postgres %s: %w", op, err)
}

// scanError marks a column that cannot be decoded as a malformed record.
func scanError(err error) error {
	var scanErr pgx.ScanArgError
	if errors.As(err, &scanErr) {
		return fmt.Errorf("%w: %w", ErrMalformedRecord, err)
	}
	return err
}

// pgRecord receives the record columns as nullable values, so that a bad
// row is reported by decode instead of failing inside pgx.
type pgRecord struct {
	fingerprint, owner, lastError                                          pgtype.Text
	status                                                                 pgtype.Int2
	attempts                                                               pgtype.Int4
	leaseUntil, createdAt, updatedAt, expiresAt, firstFailure, lastFailure pgtype.Timestamptz
	result                                                                 []byte
}

// targets returns head followed by the scan targets of recordExprs.
func (r *pgRecord) targets(head ...any) []any {
	return append(head, &r.status, &r.fingerprint, &r.attempts, &r.owner, &r.leaseUntil,
		&r.createdAt, &r.updatedAt, &r.expiresAt, &r.lastError, &r.firstFailure, &r.lastFailure, &r.result)
}

func (r *pgRecord) decode(key Key) (Record, error) {
	rec := Record{
		Key:       key,
		Status:    pgStatusOf(r.status.Int16),
		Attempts:  int(r.attempts.Int32),
		LastError: r.lastError.String,
		Result:    r.result,
	}
	var problems []string
	if rec.Status == "" {
		problems = append(problems, fmt.Sprintf("status %d", r.status.Int16))
	}
	var ok bool
	if rec.Fingerprint, ok = pgUnpack(r.fingerprint.String, fingerprintBytes); !ok || !r.fingerprint.Valid {
		problems = append(problems, fmt.Sprintf("fingerprint %q", r.fingerprint.String))
	}
	// An inbox row has no owner.
	if rec.Owner, ok = pgUnpack(r.owner.String, ownerBytes); r.owner.Valid && !ok {
		problems = append(problems, fmt.Sprintf("owner %q", r.owner.String))
	}
	if !r.attempts.Valid || rec.Attempts < 0 {
		problems = append(problems, fmt.Sprintf("attempts %d", rec.Attempts))
	}
	// Each time is read by a call rather than through a pointer into rec,
	// which would move rec to the heap: one allocation per record read.
	// Only an inbox row lacks the lease and the times of writing.
	rec.LeaseUntil = pgTime("lease_until", r.leaseUntil, false, &problems)
	rec.CreatedAt = pgTime("created_at", r.createdAt, false, &problems)
	rec.UpdatedAt = pgTime("updated_at", r.updatedAt, false, &problems)
	rec.ExpiresAt = pgTime("expires_at", r.expiresAt, true, &problems)
	rec.FirstFailure = pgTime("first_failure", r.firstFailure, false, &problems)
	rec.LastFailure = pgTime("last_failure", r.lastFailure, false, &problems)
	if rec.Status == StatusProcessing && (rec.LeaseUntil.IsZero() || rec.Owner == "") {
		problems = append(problems, "a claim in progress without its lease or owner")
	}
	if problems != nil {
		return Record{}, fmt.Errorf("%w: %s", ErrMalformedRecord, strings.Join(problems, ", "))
	}
	return rec, nil
}

// pgTime returns column name's time, the zero time when it is NULL and
// not required; it adds what is wrong with it to problems.
func pgTime(name string, src pgtype.Timestamptz, required bool, problems *[]string) time.Time {
	switch {
	case !src.Valid && required:
		*problems = append(*problems, name+" is NULL")
	case src.Valid && src.InfinityModifier != pgtype.Finite:
		*problems = append(*problems, name+" is infinite")
	case src.Valid:
		return src.Time
	}
	return time.Time{}
}

var (
	_ Store                    = (*PostgresStore)(nil)
	_ deduptype.BatchCompleter = (*PostgresStore)(nil)
)
