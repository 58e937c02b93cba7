-- The v1 record table, exactly as buildPostgresSQL (createTable, createIndex)
-- at commit 0f89898 creates it: the fixture the migration tests start from.
-- {{table}} is the quoted (and possibly schema-qualified) table name,
-- {{index}} the quoted index name: the table's bare name + "_expires_at_idx",
-- cut to 63 bytes.
CREATE TABLE IF NOT EXISTS {{table}} (
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
) WITH (fillfactor = 50);
CREATE INDEX IF NOT EXISTS {{index}} ON {{table}} (expires_at);
