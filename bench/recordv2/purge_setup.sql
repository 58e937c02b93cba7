CREATE TABLE IF NOT EXISTS pv1 (LIKE v1 INCLUDING ALL) WITH (fillfactor = 50);
CREATE TABLE IF NOT EXISTS pv2 (LIKE v2 INCLUDING ALL) WITH (fillfactor = 50);
CREATE TABLE IF NOT EXISTS pv2x (LIKE v2 INCLUDING CONSTRAINTS) WITH (fillfactor = 50);
DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_index WHERE indrelid = 'pv2x'::regclass) THEN ALTER TABLE pv2x ADD PRIMARY KEY (scope, event_id); END IF; END $$;
CREATE TABLE IF NOT EXISTS pv2part (LIKE v2 INCLUDING CONSTRAINTS) PARTITION BY RANGE (expires_at);
DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_index WHERE indrelid = 'pv2part'::regclass) THEN ALTER TABLE pv2part ADD PRIMARY KEY (scope, event_id, expires_at); END IF; END $$;
CREATE INDEX IF NOT EXISTS pv2part_brin ON pv2part USING brin (expires_at);
CREATE SEQUENCE IF NOT EXISTS pids INCREMENT 256 START 300000000;
-- v1's purge, as dedup_postgres.go runs it (purgeBatch = 1000), each batch its own transaction
CREATE OR REPLACE PROCEDURE purge_v1sql(t regclass, INOUT total bigint DEFAULT 0) LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
  LOOP
    EXECUTE format('DELETE FROM %1$s WHERE ctid = ANY(ARRAY(SELECT ctid FROM %1$s WHERE expires_at <= now() LIMIT 1000)) AND expires_at <= now()', t);
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;
    COMMIT;
    EXIT WHEN n = 0;
  END LOOP;
END $$;
-- sweep by block ranges (TID range scan, PostgreSQL 14+), no expiry index at all
CREATE OR REPLACE PROCEDURE purge_sweep(t regclass, step int, INOUT total bigint DEFAULT 0) LANGUAGE plpgsql AS $$
DECLARE n bigint; nb bigint; b bigint := 0;
BEGIN
  nb := pg_relation_size(t) / current_setting('block_size')::int;
  WHILE b < nb LOOP
    EXECUTE format('DELETE FROM %s WHERE ctid >= %L::tid AND ctid < %L::tid AND expires_at <= now()', t,
      format('(%s,0)', b), format('(%s,0)', b + step));
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;
    COMMIT;
    b := b + step;
  END LOOP;
END $$;
