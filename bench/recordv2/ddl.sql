-- floor, as a user would write it (COLLATE "C" like v1's key; dedupbench's floor uses the db default)
CREATE TABLE floor (scope text COLLATE "C" NOT NULL, event_id text COLLATE "C" NOT NULL, PRIMARY KEY (scope, event_id));
CREATE TABLE floor_dc (scope text NOT NULL, event_id text NOT NULL, PRIMARY KEY (scope, event_id));

-- v1, copied from dedup_postgres.go
CREATE TABLE v1 (
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
CREATE INDEX v1_expires_at_idx ON v1 (expires_at);
CREATE TABLE v1_nox (LIKE v1 INCLUDING ALL) WITH (fillfactor = 50);
DROP INDEX v1_nox_expires_at_idx;

-- v2 candidate: fixed-width first (alignment), key, digests as bytea, nullable tail
CREATE TABLE v2 (
	expires_at timestamptz NOT NULL,
	updated_at timestamptz NOT NULL,
	attempts smallint NOT NULL,
	status "char" NOT NULL CONSTRAINT dedup_status_check CHECK (status IN ('P', 'S', 'R', 'F')),
	scope text COLLATE "C" NOT NULL,
	event_id text COLLATE "C" NOT NULL,
	fingerprint bytea NOT NULL,
	owner bytea,
	lease_until timestamptz,
	created_at timestamptz,
	last_error text,
	first_failure timestamptz,
	last_failure timestamptz,
	result bytea,
	previous_status "char",
	PRIMARY KEY (scope, event_id)
) WITH (fillfactor = 50);
CREATE INDEX v2_expires_brin ON v2 USING brin (expires_at);
CREATE TABLE v2_btree (LIKE v2 INCLUDING CONSTRAINTS) WITH (fillfactor = 50);
ALTER TABLE v2_btree ADD PRIMARY KEY (scope, event_id);
CREATE INDEX ON v2_btree (expires_at);
CREATE TABLE v2_nox (LIKE v2 INCLUDING CONSTRAINTS) WITH (fillfactor = 50);
ALTER TABLE v2_nox ADD PRIMARY KEY (scope, event_id);
CREATE TABLE v2_ff100 (LIKE v2 INCLUDING CONSTRAINTS);
ALTER TABLE v2_ff100 ADD PRIMARY KEY (scope, event_id);
CREATE INDEX ON v2_ff100 USING brin (expires_at);
-- same as v2 but fingerprint and owner as hex text (isolates the bytea choice)
CREATE TABLE v2t (
	expires_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, attempts smallint NOT NULL,
	status "char" NOT NULL CHECK (status IN ('P', 'S', 'R', 'F')),
	scope text COLLATE "C" NOT NULL, event_id text COLLATE "C" NOT NULL,
	fingerprint text NOT NULL, owner text, lease_until timestamptz, created_at timestamptz,
	last_error text, first_failure timestamptz, last_failure timestamptz, result bytea, previous_status "char",
	PRIMARY KEY (scope, event_id)) WITH (fillfactor = 50);
CREATE INDEX ON v2t USING brin (expires_at);
-- v2 with status/attempts/updated_at nullable too: the inbox row can be (scope, event_id, fingerprint, expires_at)
CREATE TABLE v2n (
	expires_at timestamptz NOT NULL,
	scope text COLLATE "C" NOT NULL,
	event_id text COLLATE "C" NOT NULL,
	fingerprint bytea NOT NULL,
	status "char" CHECK (status IN ('P', 'S', 'R', 'F')),
	attempts smallint,
	updated_at timestamptz,
	owner bytea, lease_until timestamptz, created_at timestamptz,
	last_error text, first_failure timestamptz, last_failure timestamptz, result bytea, previous_status "char",
	PRIMARY KEY (scope, event_id)) WITH (fillfactor = 50);
CREATE INDEX ON v2n USING brin (expires_at);
-- a table holding only the inbox's 4 columns
CREATE TABLE inbox4 (scope text COLLATE "C" NOT NULL, event_id text COLLATE "C" NOT NULL,
	fingerprint bytea NOT NULL, expires_at timestamptz NOT NULL, PRIMARY KEY (scope, event_id));
CREATE INDEX ON inbox4 USING brin (expires_at);
-- key narrowing: scope id
CREATE TABLE scopes (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, name text COLLATE "C" NOT NULL UNIQUE);
INSERT INTO scopes (name) VALUES ('dedupbench/inbox');
CREATE TABLE v2_sid (
	expires_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, scope_id int NOT NULL, attempts smallint NOT NULL,
	status "char" NOT NULL CHECK (status IN ('P', 'S', 'R', 'F')),
	event_id text COLLATE "C" NOT NULL, fingerprint bytea NOT NULL, owner bytea, lease_until timestamptz, created_at timestamptz,
	last_error text, first_failure timestamptz, last_failure timestamptz, result bytea, previous_status "char",
	PRIMARY KEY (scope_id, event_id)) WITH (fillfactor = 50);
CREATE INDEX ON v2_sid USING brin (expires_at);
-- key narrowing: a 128-bit digest of (scope, event_id) as the key, the key text kept as plain columns
CREATE TABLE v2_hash (
	k uuid NOT NULL PRIMARY KEY,
	expires_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, attempts smallint NOT NULL,
	status "char" NOT NULL CHECK (status IN ('P', 'S', 'R', 'F')),
	scope text COLLATE "C" NOT NULL, event_id text COLLATE "C" NOT NULL,
	fingerprint bytea NOT NULL, owner bytea, lease_until timestamptz, created_at timestamptz,
	last_error text, first_failure timestamptz, last_failure timestamptz, result bytea, previous_status "char") WITH (fillfactor = 50);
CREATE INDEX ON v2_hash USING brin (expires_at);
-- time partitions on expires_at (daily); the key must include the partition key
CREATE TABLE v2_part (LIKE v2 INCLUDING CONSTRAINTS) PARTITION BY RANGE (expires_at);
ALTER TABLE v2_part ADD PRIMARY KEY (scope, event_id, expires_at);
DO $$ BEGIN FOR d IN -3..10 LOOP
  EXECUTE format('CREATE TABLE v2_part_%s PARTITION OF v2_part FOR VALUES FROM (%L) TO (%L) WITH (fillfactor = 50)',
    to_char(current_date + d, 'YYYYMMDD'), current_date + d, current_date + d + 1);
END LOOP; END $$;
CREATE SEQUENCE ids INCREMENT 256 START 100000000;
CREATE SEQUENCE ids1 START 200000000;
