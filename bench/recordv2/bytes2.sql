CREATE TABLE v2_sid100 (LIKE v2_sid INCLUDING ALL);
TRUNCATE v2_sid;
INSERT INTO v2_sid (expires_at, updated_at, attempts, status, scope_id, event_id, fingerprint)
SELECT now() + interval '7 days', now(), 1, 'S', 1, 'evt-' || g, decode('9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08', 'hex') FROM generate_series(1, 1000000) g;
SELECT 'v2sid inbox row ff50', pg_total_relation_size('v2_sid'), pg_table_size('v2_sid'), pg_indexes_size('v2_sid');
INSERT INTO v2_sid100 (expires_at, updated_at, attempts, status, scope_id, event_id, fingerprint)
SELECT now() + interval '7 days', now(), 1, 'S', 1, 'evt-' || g, decode('9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08', 'hex') FROM generate_series(1, 1000000) g;
SELECT 'v2sid inbox row ff100', pg_total_relation_size('v2_sid100'), pg_table_size('v2_sid100'), pg_indexes_size('v2_sid100');
TRUNCATE v2n;
INSERT INTO v2n (expires_at, scope, event_id, fingerprint)
SELECT now() + interval '7 days', 'dedupbench/inbox', 'evt-' || g, decode('9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08', 'hex') FROM generate_series(1, 1000000) g;
ALTER TABLE v2n SET (fillfactor = 100); VACUUM FULL v2n;
SELECT 'v2n 4-col inbox row ff100 (VACUUM FULL)', pg_total_relation_size('v2n'), pg_table_size('v2n'), pg_indexes_size('v2n');
ALTER TABLE v2n SET (fillfactor = 50);
