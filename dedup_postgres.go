package dedup

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

// purgeBatch bounds the rows one Purge statement deletes, so purging a large
// backlog never holds many row locks or one long transaction.
const purgeBatch = 1000

// PostgresStore is a [Store] kept in one PostgreSQL table.
//
// Each record is written twice in quick succession, claimed then settled. So
// that the second write is an in-place (HOT) update, which adds no index
// entries, the table Migrate creates keeps half of each page free
// (fillfactor 50), and a claim retains its record for its TTL plus 1/64: a
// completion within that slack leaves the indexed expiry as it is. A record
// is therefore kept at least its TTL, and at most 1/64 longer.
//
// The key columns of a table Migrate creates compare bytes (COLLATE "C"):
// each event costs several lookups in the primary key, and a key is an
// identifier, not text to sort for people. A table made before keeps the
// database's collation and works as it is.
type PostgresStore struct {
	pool  *pgxpool.Pool
	table string // quoted, for messages
	sql   postgresSQL
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
// to create its table.
func NewPostgresStore(pool *pgxpool.Pool, opts ...StoreOpt) (*PostgresStore, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: postgres store: nil pool", ErrConfig)
	}
	ident, err := parseTableName(storeTable(opts))
	if err != nil {
		return nil, err
	}
	table := ident.Sanitize()
	return &PostgresStore{pool: pool, table: table, sql: buildPostgresSQL(table, ident[len(ident)-1])}, nil
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
	createTable, createIndex, migrateLock       string
	claim, claimBatch, claimInTx, recordFailure string
	claimBatchInTx                              string
	savepoint, rollbackToSavepoint, failInTx    string
	leaseInTx                                   string
	read, readBatch, get                        string
	complete, completeBatch, completeLocated    string
	fail, extend, release, purge                string
}

// recordColumns are scanned by pgRecord.targets, in this order.
const recordColumns = `status, fingerprint, attempts, owner, lease_until, created_at,
	updated_at, expires_at, last_error, first_failure, last_failure, result`

// takeoverSet applies a claim to an existing row: an expired row starts
// afresh, a taken-over row counts one more attempt. previous_status keeps the
// status the row had, because RETURNING only sees the new row.
const takeoverSet = `status = EXCLUDED.status,
	fingerprint = EXCLUDED.fingerprint,
	attempts = CASE WHEN t.expires_at <= now() THEN 1 ELSE t.attempts + 1 END,
	owner = EXCLUDED.owner,
	lease_until = EXCLUDED.lease_until,
	created_at = CASE WHEN t.expires_at <= now() THEN now() ELSE t.created_at END,
	updated_at = now(),
	expires_at = EXCLUDED.expires_at,
	last_error = CASE WHEN t.expires_at <= now() THEN NULL ELSE t.last_error END,
	first_failure = CASE WHEN t.expires_at <= now() THEN NULL ELSE t.first_failure END,
	last_failure = CASE WHEN t.expires_at <= now() THEN NULL ELSE t.last_failure END,
	result = CASE WHEN t.expires_at <= now() THEN NULL ELSE t.result END,
	previous_status = CASE WHEN t.expires_at <= now() THEN NULL ELSE t.status END`

// claimBatchSQL is the statement that claims a list of keys at once,
// writing the rows it acquires with status: PROCESSING for ClaimBatch, or
// SUCCEEDED for a batch of the transactional inbox, whose transaction is
// then the lease.
func claimBatchSQL(table string, status Status) string {
	return `INSERT INTO ` + table + ` AS t ` + insertColumns + `
SELECT r.scope, r.event_id, '` + string(status) + `', r.fingerprint, 1, r.owner, now() + r.lease_us * interval '1 microsecond',
	now(), now(), now() + r.expiry_us * interval '1 microsecond'
FROM unnest(` + pgSplit("$1") + `, ` + pgSplit("$2") + `, coalesce($3::text[], ` + pgSplit("$4") + `), ` + pgSplit("$5") + `,
	` + pgSplit("$6") + `::bigint[], ` + pgSplit("$7") + `::bigint[])
	AS r(scope, event_id, fingerprint, owner, lease_us, expiry_us)
ON CONFLICT (scope, event_id) DO UPDATE SET ` + takeoverSet + `
WHERE ` + takeoverAllowed("EXCLUDED.fingerprint") + `
RETURNING owner, ctid, now(), previous_status, attempts, lease_until, created_at, updated_at, expires_at,
	last_error, first_failure, last_failure, result`
}

// takeoverAllowed is the state machine's takeover rule for row t claimed
// with fingerprint fp (an SQL expression): MayTakeOver in SQL, with expiry.
func takeoverAllowed(fp string) string {
	return `t.expires_at <= now() OR (t.fingerprint = ` + fp + ` AND
	(t.status = 'FAILED_RETRYABLE' OR (t.status = 'PROCESSING' AND t.lease_until <= now())))`
}

const insertColumns = `(scope, event_id, status, fingerprint, attempts, owner, lease_until,
	created_at, updated_at, expires_at)`

func buildPostgresSQL(table, bareName string) postgresSQL {
	where := `WHERE scope = $1 AND event_id = $2`
	held := where + ` AND owner = $3 AND status = 'PROCESSING' AND expires_at > now()`
	// An index name is unqualified (it lives in the table's schema) and at
	// most 63 bytes; the name is ASCII, so cutting bytes is safe.
	index := bareName + "_expires_at_idx"
	if len(index) > 63 {
		index = index[:63]
	}
	return postgresSQL{
		migrateLock: `SELECT pg_advisory_xact_lock(hashtext($1))`,
		createTable: `CREATE TABLE IF NOT EXISTS ` + table + ` (
	scope text COLLATE "C" NOT NULL,
	event_id text COLLATE "C" NOT NULL,
	status text NOT NULL CONSTRAINT dedup_status_check
		CHECK (status IN ('PROCESSING', 'SUCCEEDED', 'FAILED_RETRYABLE', 'FAILED_FINAL')),
	fingerprint text NOT NULL,
	attempts integer NOT NULL,
	owner text NOT NULL,
	lease_until timestamptz NOT NULL,
	created_at timestamptz NOT NULL,
	updated_at timestamptz NOT NULL,
	expires_at timestamptz NOT NULL,
	last_error text,
	first_failure timestamptz,
	last_failure timestamptz,
	result bytea,
	previous_status text,
	PRIMARY KEY (scope, event_id)
) WITH (fillfactor = 50)`,
		createIndex: `CREATE INDEX IF NOT EXISTS ` + pgx.Identifier{index}.Sanitize() + ` ON ` + table + ` (expires_at)`,

		// A live row the claim may not take over (a duplicate, an event in
		// flight) is answered from the statement's own read (cur): one round
		// trip, and no row lock, which a refused upsert would take and make
		// the autocommit wait for a WAL flush. A row written after the
		// statement's snapshot is refused by the upsert instead, which then
		// returns nothing, and the caller reads it.
		claim: `WITH cur AS (
	SELECT ` + recordColumns + ` FROM ` + table + ` AS t ` + where + `
	AND NOT (` + takeoverAllowed("$3") + `)
), ins AS (
	INSERT INTO ` + table + ` AS t ` + insertColumns + `
	SELECT $1, $2, 'PROCESSING', $3, 1, $4, now() + $5::interval, now(), now(), now() + $6::interval
	WHERE NOT EXISTS (SELECT FROM cur)
	ON CONFLICT (scope, event_id) DO UPDATE SET ` + takeoverSet + `
	WHERE ` + takeoverAllowed("EXCLUDED.fingerprint") + `
	RETURNING previous_status, ` + recordColumns + `
)
SELECT true, previous_status, ` + recordColumns + ` FROM ins
UNION ALL
SELECT false, NULL, ` + recordColumns + ` FROM cur`,

		// Rows are inserted in array order; callers sort the keys so that
		// concurrent batches lock rows in one order and cannot deadlock.
		// The columns come as lists (see pgList); fingerprints, which may
		// hold anything, come as an array ($3) when they cannot be a list.
		// Acquired rows are named by their new owner token, and RETURNING
		// leaves out what the request already says.
		claimBatch:     claimBatchSQL(table, StatusProcessing),
		claimBatchInTx: claimBatchSQL(table, StatusSucceeded),

		claimInTx: `INSERT INTO ` + table + ` AS t ` + insertColumns + `
VALUES ($1, $2, 'SUCCEEDED', $3, 1, $4, now(), now(), now(), now() + $5::interval)
ON CONFLICT (scope, event_id) DO UPDATE SET ` + takeoverSet + `
WHERE ` + takeoverAllowed("EXCLUDED.fingerprint") + `
RETURNING true, previous_status, ` + recordColumns,

		savepoint:           `SAVEPOINT ` + inboxSavepoint,
		rollbackToSavepoint: `ROLLBACK TO SAVEPOINT ` + inboxSavepoint,
		// The claim in the same transaction wrote the row: it is there.
		failInTx: `UPDATE ` + table + ` SET status = $3, last_error = $4,
	first_failure = COALESCE(first_failure, now()), last_failure = now(), updated_at = now(),
	expires_at = now() + $5::interval ` + where + ` RETURNING attempts`,

		// The claim in the same transaction wrote the row as succeeded; the
		// attempt's outcome will be written on the store claim path instead.
		leaseInTx: `UPDATE ` + table + ` SET status = 'PROCESSING', lease_until = now() + $3::interval,
	updated_at = now() ` + where,

		recordFailure: `INSERT INTO ` + table + ` AS t (scope, event_id, status, fingerprint, attempts, owner,
	lease_until, created_at, updated_at, expires_at, last_error, first_failure, last_failure)
VALUES ($1, $2, $3, $4, 1, $5, now(), now(), now(), now() + $6::interval, $7, now(), now())
ON CONFLICT (scope, event_id) DO UPDATE SET
	status = EXCLUDED.status,
	fingerprint = EXCLUDED.fingerprint,
	attempts = CASE WHEN t.expires_at <= now() THEN 1 ELSE t.attempts + 1 END,
	owner = EXCLUDED.owner,
	lease_until = now(),
	created_at = CASE WHEN t.expires_at <= now() THEN now() ELSE t.created_at END,
	updated_at = now(),
	expires_at = EXCLUDED.expires_at,
	last_error = EXCLUDED.last_error,
	first_failure = CASE WHEN t.expires_at <= now() THEN now() ELSE COALESCE(t.first_failure, now()) END,
	last_failure = now(),
	result = NULL,
	previous_status = NULL
WHERE t.expires_at <= now() OR (t.fingerprint = EXCLUDED.fingerprint AND
	t.status IN ('PROCESSING', 'FAILED_RETRYABLE'))
RETURNING attempts`,

		// read answers a refused claim: the row was live when it refused, so
		// it is read whatever its expiry by now.
		read: `SELECT ` + recordColumns + ` FROM ` + table + ` ` + where,
		// Each key is looked up on its own (LATERAL ... LIMIT 1), so that
		// whatever the planner estimates, a batch costs one primary-key
		// probe per key, never a scan of the table.
		readBatch: `SELECT r.i, now(), t.*
FROM unnest(` + pgSplit("$1") + `, ` + pgSplit("$2") + `) WITH ORDINALITY AS r(scope, event_id, i)
CROSS JOIN LATERAL (SELECT ` + recordColumns + ` FROM ` + table + `
	WHERE scope = r.scope AND event_id = r.event_id LIMIT 1) AS t`,
		get: `SELECT ` + recordColumns + ` FROM ` + table + ` ` + where + ` AND expires_at > now()`,

		complete: `UPDATE ` + table + ` SET status = 'SUCCEEDED', result = $4, updated_at = now(),
	expires_at = ` + keptExpiry("$5::interval", "$6::interval") + ` ` + held,
		// Rows a claim of this store just wrote are found by where it wrote
		// them (ctid): no index lookup. The list of places is computed
		// once (an InitPlan), so the planner, not knowing its length,
		// reads them directly rather than scanning the table. A row
		// updated since has moved and is left to completeBatch; one whose
		// lease ran out too, since a claim taking it over locks rows in key
		// order. Owner tokens are unique, so an owner found among the
		// batch's is the completion's own row.
		completeLocated: `UPDATE ` + table + ` SET status = 'SUCCEEDED', result = NULL, updated_at = now(),
	expires_at = ` + keptExpiry("$2::interval", "$3::interval") + `
WHERE ctid = ANY(ARRAY(SELECT unnest(` + pgSplit("$1") + `)::tid)) AND owner = ANY(` + pgSplit("$4") + `)
	AND status = 'PROCESSING' AND lease_until > now() AND expires_at > now()
RETURNING owner`,
		// Each key is looked up on its own, as in readBatch, and its row
		// updated through the ctid found: rows are locked in the order of
		// the keys, which callers sort as for claimBatch. A row updated
		// meanwhile has another ctid and is left alone: it was taken over.
		// RETURNING names the completed requests by position.
		completeBatch: `UPDATE ` + table + ` AS t SET status = 'SUCCEEDED', result = r.result, updated_at = now(),
	expires_at = ` + keptExpiry("r.ttl_us * interval '1 microsecond'", "r.expiry_us * interval '1 microsecond'") + `
FROM unnest(` + pgSplit("$1") + `, ` + pgSplit("$2") + `, ` + pgSplit("$3") + `, $4::bytea[],
	` + pgSplit("$5") + `::bigint[], ` + pgSplit("$6") + `::bigint[]) WITH ORDINALITY
	AS r(scope, event_id, owner, result, ttl_us, expiry_us, i)
CROSS JOIN LATERAL (SELECT ctid AS tid FROM ` + table + `
	WHERE scope = r.scope AND event_id = r.event_id LIMIT 1) AS k
WHERE t.ctid = k.tid AND t.owner = r.owner AND t.status = 'PROCESSING' AND t.expires_at > now()
RETURNING r.i`,
		fail: `UPDATE ` + table + ` SET status = $4, last_error = $5,
	first_failure = COALESCE(first_failure, now()), last_failure = now(), updated_at = now(),
	expires_at = now() + $6::interval ` + held,
		extend: `UPDATE ` + table + ` SET lease_until = now() + $4::interval, updated_at = now() ` + held,
		release: `UPDATE ` + table + ` SET status = 'FAILED_RETRYABLE', attempts = attempts - 1,
	lease_until = now(), updated_at = now() ` + held,
		// A row taken over between the subquery and the delete has a new
		// ctid and a later expiry, so it is skipped, never deleted live.
		purge: fmt.Sprintf(`DELETE FROM %[1]s WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM %[1]s WHERE expires_at <= now() LIMIT %[2]d)) AND expires_at <= now()`, table, purgeBatch),
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

// Migrate creates the table and its expiry index unless they exist. It is
// safe to run concurrently from several processes.
func (s *PostgresStore) Migrate(ctx context.Context) error {
	// Concurrent CREATE ... IF NOT EXISTS can still collide on the catalog
	// (pg_type's unique index), so migrations of one table take turns.
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.sql.migrateLock, "dedup migrate "+s.table); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.sql.createTable); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, s.sql.createIndex)
		return err
	})
	if err != nil {
		return fmt.Errorf("dedup: postgres migrate %s: %w", s.table, err)
	}
	return nil
}

// Claim atomically creates or takes over the record for req.Key in one
// statement, or reports why it cannot.
func (s *PostgresStore) Claim(ctx context.Context, req ClaimRequest) (Claim, error) {
	if err := req.Key.Validate(); err != nil {
		return Claim{}, fmt.Errorf("dedup: postgres claim: %w", err)
	}
	c, err := s.claim(ctx, s.pool, s.sql.claim, req,
		req.Key.Scope, req.Key.EventID, req.Fingerprint, deduptype.NewOwnerToken(), req.Lease, expiryOf(req.TTL))
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
		var previous pgtype.Text
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

func acquired(key Key, r *pgRecord, previous pgtype.Text) (Claim, error) {
	rec, err := r.decode(key)
	if err != nil {
		return Claim{}, err
	}
	c := Claim{Status: ClaimAcquired, Record: rec}
	if previous.Valid {
		if c.Previous = Status(previous.String); !c.Previous.Valid() {
			return Claim{}, fmt.Errorf("%w: previous status %q", ErrMalformedRecord, previous.String)
		}
	}
	return c, nil
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
	return s.settle(ctx, "complete", key, s.sql.complete, key.Scope, key.EventID, owner, result, ttl, expiryOf(ttl))
}

// Fail records a failed attempt if owner still holds the record; otherwise
// it returns ErrLeaseLost.
func (s *PostgresStore) Fail(ctx context.Context, key Key, owner string, f Failure) error {
	status := StatusFailedRetryable
	if f.Final {
		status = StatusFailedFinal
	}
	return s.settle(ctx, "fail", key, s.sql.fail, key.Scope, key.EventID, owner, string(status), f.Error, f.TTL)
}

// Extend pushes the lease of a held record to lease from now, or returns
// ErrLeaseLost.
func (s *PostgresStore) Extend(ctx context.Context, key Key, owner string, lease time.Duration) error {
	return s.settle(ctx, "extend", key, s.sql.extend, key.Scope, key.EventID, owner, lease)
}

// Release gives back a claim whose handler never started: the record is
// claimable at once and the attempt is not counted.
func (s *PostgresStore) Release(ctx context.Context, key Key, owner string) error {
	return s.settle(ctx, "release", key, s.sql.release, key.Scope, key.EventID, owner)
}

// settle runs an update fenced on the owner token.
func (s *PostgresStore) settle(ctx context.Context, op string, key Key, query string, args ...any) error {
	if err := key.Validate(); err != nil {
		return fmt.Errorf("dedup: postgres %s: %w", op, err)
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
	rec, err := s.read(ctx, s.pool, s.sql.get, key)
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, fmt.Errorf("dedup: postgres get %s: %w", key, ErrNotFound)
	}
	if err != nil {
		return Record{}, s.opError("get "+key.String(), err)
	}
	return rec, nil
}

// Purge deletes expired records, a bounded batch per statement until none
// is left, and returns how many it removed.
func (s *PostgresStore) Purge(ctx context.Context) (int, error) {
	total := 0
	for {
		if err := ctx.Err(); err != nil {
			return total, fmt.Errorf("dedup: postgres purge: %w", err)
		}
		tag, err := s.pool.Exec(ctx, s.sql.purge)
		if err != nil {
			return total, s.opError("purge", err)
		}
		total += int(tag.RowsAffected())
		if tag.RowsAffected() < purgeBatch {
			return total, nil
		}
	}
}

// claimInTx records req as SUCCEEDED inside the caller's transaction, for the
// transactional inbox: the record commits or vanishes with the handler's own
// writes. A concurrent claim of the same key waits for this transaction and
// then sees a duplicate (commit) or acquires the key itself (rollback). When
// the claim is acquired, the savepoint inboxSavepoint follows it in the same
// round trip, so that a failed attempt can undo the handler's writes and
// still record its failure while the row stays locked.
func (s *PostgresStore) claimInTx(ctx context.Context, tx pgx.Tx, req ClaimRequest) (Claim, error) {
	if err := req.Key.Validate(); err != nil {
		return Claim{}, fmt.Errorf("dedup: postgres claim in tx: %w", err)
	}
	args := []any{req.Key.Scope, req.Key.EventID, req.Fingerprint, deduptype.NewOwnerToken(), req.TTL}
	var b pgx.Batch
	b.Queue(s.sql.claimInTx, args...)
	b.Queue(s.sql.savepoint)
	br := tx.SendBatch(ctx, &b)
	var r pgRecord
	var previous pgtype.Text
	var won bool // always true: the upsert returns only what it wrote
	err := br.QueryRow().Scan(r.targets(&won, &previous)...)
	_, serr := br.Exec()
	if cerr := br.Close(); serr == nil {
		serr = cerr
	}
	var c Claim
	switch {
	case err == nil && serr == nil:
		c, err = acquired(req.Key, &r, previous)
	case err == nil:
		err = serr
	case errors.Is(err, pgx.ErrNoRows):
		// Refused: the savepoint is harmless, the transaction ends here.
		c, err = s.claim(ctx, tx, s.sql.claimInTx, req, args...)
	default:
		err = scanError(err)
	}
	if err != nil {
		return Claim{}, s.opError("claim in tx "+req.Key.String(), err)
	}
	return c, nil
}

// failInTx records a failed inbox attempt in its own transaction, after
// rolling back to the savepoint claimInTx took: the handler's writes vanish,
// the row stays locked, and the failure commits with the claim's attempt. It
// returns the attempts recorded.
func (s *PostgresStore) failInTx(ctx context.Context, tx pgx.Tx, key Key, f Failure) (int, error) {
	attempts, err := s.failInBatchTx(ctx, tx, key, f, true)
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
func (s *PostgresStore) failInBatchTx(ctx context.Context, tx pgx.Tx, key Key, f Failure, rollback bool) (int, error) {
	if rollback {
		if err := s.rollbackToClaim(ctx, tx, key); err != nil {
			return 0, err
		}
	}
	status := StatusFailedRetryable
	if f.Final {
		status = StatusFailedFinal
	}
	var attempts int
	if err := tx.QueryRow(ctx, s.sql.failInTx, key.Scope, key.EventID, string(status), f.Error, f.TTL).Scan(&attempts); err != nil {
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
// into a claim in progress with a lease, committed with tx: its outcome is
// then settled by fenced writes on the claim's owner token.
func (s *PostgresStore) leaseInTx(ctx context.Context, tx pgx.Tx, key Key, lease time.Duration) error {
	if _, err := tx.Exec(ctx, s.sql.leaseInTx, key.Scope, key.EventID, lease); err != nil {
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
	status := StatusFailedRetryable
	if f.Final {
		status = StatusFailedFinal
	}
	var attempts int
	err := s.pool.QueryRow(ctx, s.sql.recordFailure, req.Key.Scope, req.Key.EventID, string(status),
		req.Fingerprint, deduptype.NewOwnerToken(), f.TTL, f.Error).Scan(&attempts)
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
	status, fingerprint, owner, lastError                                  pgtype.Text
	attempts                                                               pgtype.Int4
	leaseUntil, createdAt, updatedAt, expiresAt, firstFailure, lastFailure pgtype.Timestamptz
	result                                                                 []byte
}

// targets returns head followed by the scan targets of recordColumns.
func (r *pgRecord) targets(head ...any) []any {
	return append(head, &r.status, &r.fingerprint, &r.attempts, &r.owner, &r.leaseUntil,
		&r.createdAt, &r.updatedAt, &r.expiresAt, &r.lastError, &r.firstFailure, &r.lastFailure, &r.result)
}

func (r *pgRecord) decode(key Key) (Record, error) {
	rec := Record{
		Key:         key,
		Status:      Status(r.status.String),
		Fingerprint: r.fingerprint.String,
		Attempts:    int(r.attempts.Int32),
		Owner:       r.owner.String,
		LastError:   r.lastError.String,
		Result:      r.result,
	}
	var problems []string
	if !rec.Status.Valid() {
		problems = append(problems, fmt.Sprintf("status %q", rec.Status))
	}
	for _, c := range []struct {
		name  string
		valid bool
	}{{"fingerprint", r.fingerprint.Valid}, {"owner", r.owner.Valid}, {"attempts", r.attempts.Valid}} {
		if !c.valid {
			problems = append(problems, c.name+" is NULL")
		}
	}
	if rec.Attempts < 0 {
		problems = append(problems, fmt.Sprintf("attempts %d", rec.Attempts))
	}
	// Each time is read by a call rather than through a pointer into rec,
	// which would move rec to the heap: one allocation per record read.
	rec.LeaseUntil = pgTime("lease_until", r.leaseUntil, true, &problems)
	rec.CreatedAt = pgTime("created_at", r.createdAt, true, &problems)
	rec.UpdatedAt = pgTime("updated_at", r.updatedAt, true, &problems)
	rec.ExpiresAt = pgTime("expires_at", r.expiresAt, true, &problems)
	rec.FirstFailure = pgTime("first_failure", r.firstFailure, false, &problems)
	rec.LastFailure = pgTime("last_failure", r.lastFailure, false, &problems)
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
