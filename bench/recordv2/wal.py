import subprocess, re
DB = "postgres://postgres@127.0.0.1:5432/v2lab"
names = "floor v1 v1_nothing v1_nox_nothing v2_full v2t_full v2btree_full v2nox_full v2ff100_full v2part_full v2sid_full v2hash_full v2_inbox v2_inbox_nothing v2ff100_inbox v2n_inbox4 v2n_inbox4_nothing inbox4".split()
ren = {'floor': 'floor_w', 'v1': 'v1_w', 'v2': 'v2_w'}
for n in names:
    body = open(f'scripts/{n}.batch.sql').read().split('\n')
    stmt = '\n'.join(body[1:-2]).rstrip(';').replace("nextval('ids')", "nextval('wids')")
    t = open(f'scripts/{n}.table').read()
    if t in ren:
        stmt = re.sub(rf'INSERT INTO {t}\b', f'INSERT INTO {ren[t]}', stmt, count=1); t = ren[t]
    sql = f"TRUNCATE {t};\n" + (stmt + ";\n") * 10 + "EXPLAIN (ANALYZE, WAL, COSTS OFF, TIMING OFF, SUMMARY OFF) " + stmt + ";\n"
    out = subprocess.run(["psql", "-X", "-q", "-At", DB], input=sql, capture_output=True, text=True).stdout
    m = re.search(r'WAL: records=(\d+)(?: fpi=(\d+))? bytes=(\d+)', out)
    rec, fpi, b = int(m.group(1)), int(m.group(2) or 0), int(m.group(3))
    print(f"{n:20s} wal_records/row={rec/256:.2f} fpi={fpi} wal_bytes/row={b/256:.0f}")
