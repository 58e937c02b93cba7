#!/bin/bash
# usage: purge_fill.sh table : 1,000,000 expired rows (yesterday) then 1,000,000 live ones, then VACUUM ANALYZE
DB=postgres://postgres@127.0.0.1:5432/v2lab
t=$1
FP="'9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08'"
OLD="(date_trunc('day', now()) - interval '1 day' + g * interval '50 ms')"
NEW="(now() + interval '7 days' + (g - 1000000) * interval '1 ms')"
if [ $t = pv2part ]; then
  psql -X -q $DB -c "CREATE TABLE IF NOT EXISTS pv2part_$(date -d yesterday +%Y%m%d) PARTITION OF pv2part FOR VALUES FROM ('$(date -d yesterday +%F)') TO ('$(date +%F)') WITH (fillfactor = 50)"
fi
psql -X -q $DB -c "TRUNCATE $t"
for half in old new; do
  if [ $half = old ]; then E=$OLD; r="1, 1000000"; else E=$NEW; r="1000001, 2000000"; fi
  if [ $t = pv1 ]; then
    psql -X -q $DB -c "INSERT INTO pv1 (scope, event_id, status, fingerprint, attempts, owner, lease_until, created_at, updated_at, expires_at)
      SELECT 'dedupbench/inbox', 'evt-' || g, 'SUCCEEDED', $FP, 1, '5f4dcc3b5aa765d61d8327deb882cf99', $E - interval '7 days', $E - interval '7 days', $E - interval '7 days', $E FROM generate_series($r) g"
  else
    psql -X -q $DB -c "INSERT INTO $t (expires_at, updated_at, attempts, status, scope, event_id, fingerprint)
      SELECT $E, $E - interval '7 days', 1, 'S', 'dedupbench/inbox', 'evt-' || g, decode($FP, 'hex') FROM generate_series($r) g"
  fi
done
psql -X -q $DB -c "VACUUM (ANALYZE) $t" -c CHECKPOINT
