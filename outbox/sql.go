package outbox

import "github.com/jackc/pgx/v5"

// statements holds every statement of an outbox, built once for its table.
type statements struct {
	migrateLock, createTable, createPending, createKeyHead, createSent string
	createBackoff                                                      string
	lockKeys, insert, notify                                           string
	claim, read, markSent, deleteSent, markFailed                      string
	requeue, failed, states, purge                                     string
	backlog, stats                                                     string
}

func buildStatements(table, bare string) statements {
	index := func(suffix string) string { return pgx.Identifier{bare + suffix}.Sanitize() }
	return statements{
		migrateLock: `SELECT pg_advisory_xact_lock(hashtext('dedup outbox migrate'))`,
		// seq is the order of publication: assigned at INSERT, after the
		// key's advisory lock, so that within a key it is commit order.
		createTable: `CREATE TABLE IF NOT EXISTS ` + table + ` (
			seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			event_id text NOT NULL UNIQUE,
			destination text NOT NULL,
			key bytea,
			headers jsonb,
			payload bytea NOT NULL,
			tenant text,
			status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'failed')),
			attempts integer NOT NULL DEFAULT 0,
			last_error text,
			created_at timestamptz NOT NULL DEFAULT now(),
			due_at timestamptz NOT NULL DEFAULT now(),
			sent_at timestamptz
		)`,
		// The relay's scan: pending rows in publication order.
		createPending: `CREATE INDEX IF NOT EXISTS ` + index("_pending") + ` ON ` + table + ` (seq) WHERE status = 'pending'`,
		// The ordering check: is an earlier row of this key still pending?
		createKeyHead: `CREATE INDEX IF NOT EXISTS ` + index("_pending_key") + ` ON ` + table + ` (destination, key, seq) WHERE status = 'pending' AND key IS NOT NULL`,
		createSent:    `CREATE INDEX IF NOT EXISTS ` + index("_sent") + ` ON ` + table + ` (sent_at) WHERE status = 'sent'`,
		// Keyed pending rows that failed at least once, in the order their
		// backoff ends: the rows that may hold their key back. Writing an
		// event never touches it. (Tables made before it have a _retried
		// index in its place, which nothing reads any more.)
		createBackoff: `CREATE INDEX IF NOT EXISTS ` + index("_backoff") + ` ON ` + table + ` (due_at) WHERE status = 'pending' AND attempts > 0 AND key IS NOT NULL`,

		// The hashes come sorted, and unnest keeps array order, so two
		// writers lock shared keys in the same order.
		lockKeys: `SELECT count(pg_advisory_xact_lock(h)) FROM unnest($1::bigint[]) AS h`,
		insert: `INSERT INTO ` + table + ` (event_id, destination, key, headers, payload, tenant)
			SELECT id, dest, key, headers, payload, tenant
			FROM unnest($1::text[], $2::text[], $3::bytea[], $4::jsonb[], $5::bytea[], $6::text[]) WITH ORDINALITY
				AS e(id, dest, key, headers, payload, tenant, n)
			ORDER BY n`,
		notify: `SELECT pg_notify($1, '')`,

		// Due pending rows are locked in publication order, skipping the
		// keys held back by an event waiting out its backoff, rows another
		// relay holds and, through a transaction-scoped advisory lock per
		// key ($2 is the outbox's namespace, apart from the one-bigint locks
		// of Add), the keys another relay holds: a key is published by one
		// relay at a time, and a relay never locks rows it could not
		// publish, which would stall the others.
		//
		// Each statement of a pass has one plan whatever the statistics say
		// (planSettings forbids sorts, sequential and bitmap scans): held
		// is read once, from _backoff, the one index in due_at order; the
		// rows come from _pending, the index of pending rows in seq order.
		claim: `WITH held AS MATERIALIZED (
				SELECT destination, key FROM ` + table + `
				WHERE status = 'pending' AND attempts > 0 AND key IS NOT NULL AND due_at > now()
				ORDER BY due_at
			)
			SELECT seq FROM ` + table + ` o WHERE status = 'pending' AND due_at <= now()
				AND (key IS NULL OR (destination, key) NOT IN (SELECT destination, key FROM held))
				AND (key IS NULL OR pg_try_advisory_xact_lock($2, hashtext(destination || ':' || encode(key, 'hex'))))
			ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED`,
		// Of the claimed rows ($1), a row is published only if no pending
		// row of its key outside them comes before it. It runs after claim,
		// with a snapshot taken once the key locks are held, so that it sees
		// all the keys' previous relays committed. keys is read once from
		// the batch; for each key, stop is found by one range scan of
		// _pending_key from the key's head, reading at most the key's
		// claimed rows and one more: LATERAL with a LIMIT runs once per
		// key (it cannot be flattened into a join), and _pending_key is the
		// only index in (destination, key, seq) order.
		read: `WITH b AS MATERIALIZED (
				SELECT seq, event_id, destination, key, headers, payload, tenant, attempts
				FROM ` + table + ` WHERE seq = ANY($1) AND status = 'pending'
			), keys AS MATERIALIZED (
				SELECT destination, key, count(*) AS n FROM b WHERE key IS NOT NULL GROUP BY destination, key
			), h AS MATERIALIZED (
				SELECT k.destination, k.key, min(p.seq) FILTER (WHERE p.seq <> ALL($1)) AS stop
				FROM keys k CROSS JOIN LATERAL (
					SELECT e.seq, e.destination, e.key FROM ` + table + ` e
					WHERE e.status = 'pending' AND e.key IS NOT NULL AND (e.destination, e.key) >= (k.destination, k.key)
					ORDER BY e.destination, e.key, e.seq LIMIT k.n + 1) p
				WHERE p.destination = k.destination AND p.key = k.key
				GROUP BY k.destination, k.key
			)
			SELECT b.seq, b.event_id, b.destination, b.key, b.headers, b.payload, b.tenant, b.attempts
			FROM b LEFT JOIN h ON h.destination = b.destination AND h.key = b.key
			WHERE h.stop IS NULL OR b.seq < h.stop
			ORDER BY b.seq`,
		markSent:   `UPDATE ` + table + ` SET status = 'sent', sent_at = now(), last_error = NULL WHERE seq = ANY($1)`,
		deleteSent: `DELETE FROM ` + table + ` WHERE seq = ANY($1)`,
		// $4: the attempts after which a row is failed; a permanent error
		// ($5) fails it at once.
		markFailed: `UPDATE ` + table + ` o SET attempts = o.attempts + 1, last_error = f.err,
				due_at = now() + f.delay_ms * interval '1 millisecond',
				status = CASE WHEN f.permanent OR o.attempts + 1 >= $4 THEN 'failed' ELSE 'pending' END
			FROM unnest($1::bigint[], $2::text[], $3::bigint[], $5::bool[]) AS f(seq, err, delay_ms, permanent)
			WHERE o.seq = f.seq`,

		requeue: `UPDATE ` + table + ` SET status = 'pending', attempts = 0, due_at = now()
			WHERE status = 'failed' AND event_id = ANY($1)`,
		failed: `SELECT event_id, destination, key, attempts, COALESCE(last_error, ''), created_at, due_at
			FROM ` + table + ` WHERE status = 'failed' ORDER BY seq LIMIT $1`,
		states: `SELECT event_id, status FROM ` + table + ` WHERE event_id = ANY($1)`,
		backlog: `SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
			FROM ` + table + ` WHERE status = 'pending'`,
		stats: `SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'failed'),
			count(*) FILTER (WHERE status = 'sent'),
			coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE status = 'pending')), 0)::float8
			FROM ` + table,
		purge: `DELETE FROM ` + table + ` WHERE seq IN (
				SELECT seq FROM ` + table + ` WHERE status = 'sent' AND sent_at < now() - $1 * interval '1 millisecond'
				LIMIT $2 FOR UPDATE SKIP LOCKED)`,
	}
}
