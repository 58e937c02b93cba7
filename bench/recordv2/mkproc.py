import re
for v in "fw v1w v2w_full v2w_inbox v2nw_inbox4".split():
    s = open(f'scripts/{v}.single.proc.sql').read()
    stmt = re.search(r'LOOP\n(.*);\nCOMMIT', s, re.S).group(1)
    if 'RETURNING' in stmt:
        body = f"WITH x AS ({stmt}) SELECT count(*) INTO d FROM x"
    else:
        body = stmt
    open(f'scripts/{v}.single.proc.sql','w').write(
      f"CREATE OR REPLACE PROCEDURE run_{v}(n int) LANGUAGE plpgsql AS $p$ DECLARE d int; BEGIN FOR i IN 1..n LOOP\n{body};\nCOMMIT; END LOOP; END $p$;\n")
