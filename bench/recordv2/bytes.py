import re
names = "floor v1 v2_full v2t_full v2btree_full v2nox_full v2ff100_full v2part_full v2sid_full v2hash_full v2_inbox v2ff100_inbox v2n_inbox4 inbox4".split()
out = []
for n in names:
    body = open(f'scripts/{n}.batch.sql').read().split('\n')
    stmt = '\n'.join(body[1:-2]).rstrip(';')
    stmt = stmt.replace("FROM (SELECT nextval('ids') AS b) s CROSS JOIN LATERAL generate_series(s.b, s.b + 255) g", "FROM generate_series(1, 1000000) g")
    stmt = re.sub(r'\nON CONFLICT.*', '\nON CONFLICT DO NOTHING', stmt, flags=re.S)
    t = open(f'scripts/{n}.table').read()
    out.append(f"TRUNCATE {t};\n\\echo {n}\n{stmt};\n"
      f"SELECT '{n}' AS variant, pg_total_relation_size('{t}') AS total, pg_table_size('{t}') AS heap, pg_indexes_size('{t}') AS indexes,"
      f" (SELECT string_agg(indexrelid::regclass || '=' || pg_relation_size(indexrelid), ' ') FROM pg_index WHERE indrelid = '{t}'::regclass) AS each_index;\n")
open('bytes.sql','w').write(''.join(out))
