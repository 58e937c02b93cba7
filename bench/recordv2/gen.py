import sys, os
S = "'dedupbench/inbox'"
FPH = "'9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08'"
FPB = "'\\x9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08'::bytea"
OWH = "'5f4dcc3b5aa765d61d8327deb882cf99'"
OWB = "'\\x5f4dcc3b5aa765d61d8327deb882cf99'::bytea"
EXP = "now() + interval '7 days 157 min 30 s'"
LEASE = "now() + interval '5 min'"
ID = "'evt-' || g"
V1COLS = "(scope, event_id, status, fingerprint, attempts, owner, lease_until, created_at, updated_at, expires_at)"
V1VALS = f"{S}, {ID}, 'SUCCEEDED', {FPH}, 1, {OWH}, now(), now(), now(), {EXP}"
V1SET = """status = EXCLUDED.status, fingerprint = EXCLUDED.fingerprint,
 attempts = CASE WHEN t.expires_at <= now() THEN 1 ELSE t.attempts + 1 END, owner = EXCLUDED.owner, lease_until = EXCLUDED.lease_until,
 created_at = CASE WHEN t.expires_at <= now() THEN now() ELSE t.created_at END, updated_at = now(), expires_at = EXCLUDED.expires_at,
 last_error = CASE WHEN t.expires_at <= now() THEN NULL ELSE t.last_error END,
 first_failure = CASE WHEN t.expires_at <= now() THEN NULL ELSE t.first_failure END,
 last_failure = CASE WHEN t.expires_at <= now() THEN NULL ELSE t.last_failure END,
 result = CASE WHEN t.expires_at <= now() THEN NULL ELSE t.result END,
 previous_status = CASE WHEN t.expires_at <= now() THEN NULL ELSE t.status END"""
V1WHERE = """t.expires_at <= now() OR (t.fingerprint = EXCLUDED.fingerprint AND (t.status = 'FAILED_RETRYABLE' OR (t.status = 'PROCESSING' AND t.lease_until <= now())))"""
V1RET = "owner, ctid, now(), previous_status, attempts, lease_until, created_at, updated_at, expires_at, last_error, first_failure, last_failure, result"
V2SET = V1SET  # same column names
V2WHERE = """t.expires_at <= now() OR (t.fingerprint = EXCLUDED.fingerprint AND (t.status = 'R' OR (t.status = 'P' AND t.lease_until <= now())))"""
V2NWHERE = """t.expires_at <= now() OR (t.fingerprint = EXCLUDED.fingerprint AND (t.status = 'R' OR (t.status = 'P' AND t.lease_until <= now())))"""
V2NSET = """status = EXCLUDED.status, fingerprint = EXCLUDED.fingerprint,
 attempts = CASE WHEN t.expires_at <= now() THEN NULL ELSE coalesce(t.attempts, 1) + 1 END, owner = EXCLUDED.owner, lease_until = EXCLUDED.lease_until,
 updated_at = EXCLUDED.updated_at, expires_at = EXCLUDED.expires_at,
 last_error = CASE WHEN t.expires_at <= now() THEN NULL ELSE t.last_error END,
 previous_status = CASE WHEN t.expires_at <= now() THEN NULL ELSE coalesce(t.status, 'S') END"""
V2FULLCOLS = "(expires_at, updated_at, attempts, status, scope, event_id, fingerprint, owner, lease_until, created_at)"
V2FULLVALS = f"{EXP}, now(), 1, 'P', {S}, {ID}, {FPB}, {OWB}, {LEASE}, now()"
V2TVALS = f"{EXP}, now(), 1, 'P', {S}, {ID}, {FPH}, {OWH}, {LEASE}, now()"
V2INBCOLS = "(expires_at, updated_at, attempts, status, scope, event_id, fingerprint)"
V2INBVALS = f"{EXP}, now(), 1, 'S', {S}, {ID}, {FPB}"
IN4COLS = "(expires_at, scope, event_id, fingerprint)"
IN4VALS = f"{EXP}, {S}, {ID}, {FPB}"
V = {
 'floor':      ('floor', "(scope, event_id)", f"{S}, {ID}", "ON CONFLICT DO NOTHING"),
 'floor_dc':   ('floor_dc', "(scope, event_id)", f"{S}, {ID}", "ON CONFLICT DO NOTHING"),
 'v1':         ('v1', V1COLS, V1VALS, f"ON CONFLICT (scope, event_id) DO UPDATE SET {V1SET} WHERE {V1WHERE} RETURNING {V1RET}"),
 'v1_nothing': ('v1', V1COLS, V1VALS, "ON CONFLICT DO NOTHING"),
 'v1_nox_nothing': ('v1_nox', V1COLS, V1VALS, "ON CONFLICT DO NOTHING"),
 'v2_full':    ('v2', V2FULLCOLS, V2FULLVALS, "ON CONFLICT DO NOTHING"),
 'v2t_full':   ('v2t', V2FULLCOLS, V2TVALS, "ON CONFLICT DO NOTHING"),
 'v2btree_full': ('v2_btree', V2FULLCOLS, V2FULLVALS, "ON CONFLICT DO NOTHING"),
 'v2nox_full': ('v2_nox', V2FULLCOLS, V2FULLVALS, "ON CONFLICT DO NOTHING"),
 'v2ff100_full': ('v2_ff100', V2FULLCOLS, V2FULLVALS, "ON CONFLICT DO NOTHING"),
 'v2part_full': ('v2_part', V2FULLCOLS, V2FULLVALS, "ON CONFLICT DO NOTHING"),
 'v2sid_full': ('v2_sid', "(expires_at, updated_at, attempts, status, scope_id, event_id, fingerprint, owner, lease_until, created_at)",
                f"{EXP}, now(), 1, 'P', 1, {ID}, {FPB}, {OWB}, {LEASE}, now()", "ON CONFLICT DO NOTHING"),
 'v2hash_full': ('v2_hash', "(k, expires_at, updated_at, attempts, status, scope, event_id, fingerprint, owner, lease_until, created_at)",
                f"md5({S} || '/' || {ID})::uuid, {V2FULLVALS}", "ON CONFLICT DO NOTHING"),
 'v2_inbox':   ('v2', V2INBCOLS, V2INBVALS, f"ON CONFLICT (scope, event_id) DO UPDATE SET {V2SET} WHERE {V2WHERE} RETURNING event_id, attempts, previous_status"),
 'v2_inbox_nothing': ('v2', V2INBCOLS, V2INBVALS, "ON CONFLICT DO NOTHING"),
 'v2ff100_inbox': ('v2_ff100', V2INBCOLS, V2INBVALS, f"ON CONFLICT (scope, event_id) DO UPDATE SET {V2SET} WHERE {V2WHERE} RETURNING event_id, attempts, previous_status"),
 'v2n_inbox4': ('v2n', IN4COLS, IN4VALS, f"ON CONFLICT (scope, event_id) DO UPDATE SET {V2NSET} WHERE {V2NWHERE} RETURNING event_id, attempts, previous_status"),
 'v2n_inbox4_nothing': ('v2n', IN4COLS, IN4VALS, "ON CONFLICT DO NOTHING"),
 'inbox4':     ('inbox4', IN4COLS, IN4VALS, "ON CONFLICT DO NOTHING"),
}
os.makedirs('scripts', exist_ok=True)
for name, (table, cols, vals, tail) in V.items():
    alias = " AS t" if "t." in tail else ""
    batch = f"BEGIN;\nINSERT INTO {table}{alias} {cols}\nSELECT {vals}\nFROM (SELECT nextval('ids') AS b) s CROSS JOIN LATERAL generate_series(s.b, s.b + 255) g\n{tail};\nCOMMIT;\n"
    single = f"BEGIN;\nINSERT INTO {table}{alias} {cols}\nSELECT {vals}\nFROM (SELECT nextval('ids1') AS g) s\n{tail};\nCOMMIT;\n"
    # pgbench needs one statement per line unless it ends with ; -- it supports multi-line SQL until ';'
    open(f'scripts/{name}.batch.sql','w').write(batch)
    open(f'scripts/{name}.single.sql','w').write(single)
    open(f'scripts/{name}.table','w').write(table)
print(' '.join(V))
for name, (table, cols, vals, tail) in V.items():
    for mode, n in (('batch', 782), ('single', 20000)):
        body = open(f'scripts/{name}.{mode}.sql').read().split('\n')
        stmt = '\n'.join(body[1:-2]).rstrip(';')
        open(f'scripts/{name}.{mode}.call.sql','w').write(f"CALL runbatches($stmt${stmt}$stmt$, {n});\n")
