-- v1 rows of every state, written with plain SQL as the code of 0f89898
-- would have left them, into the table schema.sql creates. Placeholders:
-- {{table}} the quoted table name, {{scope}} the scope as an SQL literal,
-- {{hot}} and {{bulk}} how many SUCCEEDED rows to write under the keys
-- hot-000001... (the keys the consumers of the tests deliver again) and
-- bulk-000001... (keys only the migration's copy moves).
--
-- Every fingerprint but the odd ones is the default fingerprint of the
-- event's payload, 'body:' || event_id: the hex SHA-256 of its bytes.
INSERT INTO {{table}} (scope, event_id, status, fingerprint, attempts, owner, lease_until,
	created_at, updated_at, expires_at, last_error, first_failure, last_failure, result, previous_status)
VALUES
	-- succeeded on its second attempt, with a stored result
	({{scope}}, 'succeeded', 'SUCCEEDED', encode(sha256(convert_to('body:succeeded', 'UTF8')), 'hex'), 2,
		'5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a', now() - interval '50 minutes', now() - interval '2 hours',
		now() - interval '50 minutes', now() + interval '1 day', 'first try timed out',
		now() - interval '2 hours', now() - interval '2 hours', '\x7b226f6b223a747275657d'::bytea, 'FAILED_RETRYABLE'),
	-- in flight: a live lease of one hour held by a known owner token
	({{scope}}, 'live', 'PROCESSING', encode(sha256(convert_to('body:live', 'UTF8')), 'hex'), 1,
		'c0ffee00c0ffee00c0ffee00c0ffee01', now() + interval '1 hour', now() - interval '1 minute',
		now() - interval '1 minute', now() + interval '1 day', NULL, NULL, NULL, NULL, NULL),
	-- in flight once, its owner died: the lease lapsed a minute ago
	({{scope}}, 'expired-lease', 'PROCESSING', encode(sha256(convert_to('body:expired-lease', 'UTF8')), 'hex'), 1,
		'dead0000dead0000dead0000dead0001', now() - interval '1 minute', now() - interval '10 minutes',
		now() - interval '10 minutes', now() + interval '1 day', NULL, NULL, NULL, NULL, NULL),
	-- failed twice, may be tried again
	({{scope}}, 'retryable', 'FAILED_RETRYABLE', encode(sha256(convert_to('body:retryable', 'UTF8')), 'hex'), 2,
		'dead0000dead0000dead0000dead0002', now() - interval '3 minutes', now() - interval '20 minutes',
		now() - interval '3 minutes', now() + interval '1 day', 'downstream 503',
		now() - interval '15 minutes', now() - interval '3 minutes', NULL, 'PROCESSING'),
	-- failed for good (dead-lettered)
	({{scope}}, 'final', 'FAILED_FINAL', encode(sha256(convert_to('body:final', 'UTF8')), 'hex'), 5,
		'dead0000dead0000dead0000dead0003', now() - interval '5 minutes', now() - interval '30 minutes',
		now() - interval '5 minutes', now() + interval '1 day', 'poison: cannot parse',
		now() - interval '29 minutes', now() - interval '5 minutes', NULL, 'FAILED_RETRYABLE'),
	-- succeeded, and expired a minute ago: as if absent
	({{scope}}, 'expired', 'SUCCEEDED', encode(sha256(convert_to('body:expired', 'UTF8')), 'hex'), 1,
		'dead0000dead0000dead0000dead0004', now() - interval '2 days', now() - interval '2 days',
		now() - interval '2 days', now() - interval '1 minute', NULL, NULL, NULL, NULL, NULL),
	-- a custom fingerprint that is not hex, and an owner that is not hex either
	({{scope}}, 'custom-fp', 'SUCCEEDED', 'v1:custom', 1,
		'v1-owner-not-hex', now() - interval '1 hour', now() - interval '1 hour',
		now() - interval '1 hour', now() + interval '1 day', NULL, NULL, NULL, 'custom'::bytea, NULL),
	-- hex, but starting with "00": kept as text by the v2 packing
	({{scope}}, 'zero-fp', 'SUCCEEDED', '00' || repeat('ab', 31), 1,
		'00ff00ff00ff00ff00ff00ff00ff00ff', now() - interval '1 hour', now() - interval '1 hour',
		now() - interval '1 hour', now() + interval '1 day', NULL, NULL, NULL, NULL, NULL),
	-- hex in capitals: not the canonical form, kept as text
	({{scope}}, 'upper-fp', 'SUCCEEDED', upper(encode(sha256(convert_to('body:upper-fp', 'UTF8')), 'hex')), 1,
		'ABCDEF0123456789ABCDEF0123456789', now() - interval '1 hour', now() - interval '1 hour',
		now() - interval '1 hour', now() + interval '1 day', NULL, NULL, NULL, ''::bytea, NULL),
	-- written by the transactional inbox of v1: SUCCEEDED at once, lease_until = created_at
	({{scope}}, 'inbox', 'SUCCEEDED', encode(sha256(convert_to('body:inbox', 'UTF8')), 'hex'), 1,
		'1b0c1b0c1b0c1b0c1b0c1b0c1b0c1b0c', now() - interval '4 minutes', now() - interval '4 minutes',
		now() - interval '4 minutes', now() + interval '1 day', NULL, NULL, NULL, NULL, NULL);

INSERT INTO {{table}} (scope, event_id, status, fingerprint, attempts, owner, lease_until,
	created_at, updated_at, expires_at)
SELECT {{scope}}, k.id, 'SUCCEEDED', encode(sha256(convert_to('body:' || k.id, 'UTF8')), 'hex'), 1,
	md5(k.id), now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour',
	now() + interval '1 day'
FROM (SELECT 'hot-' || lpad(i::text, 6, '0') FROM generate_series(1, {{hot}}) AS i
	UNION ALL
	SELECT 'bulk-' || lpad(i::text, 6, '0') FROM generate_series(1, {{bulk}}) AS i) AS k(id);
