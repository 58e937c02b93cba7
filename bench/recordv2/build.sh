#!/bin/bash
# usage: build.sh table from to : appends rows evt-from..evt-to, written as the inbox writes them, times it
DB=postgres://postgres@127.0.0.1:5432/v2lab
t=$1; a=$2; b=$3
FP="'9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08'"
TS="(now() - interval '6 days' + g * interval '50 ms')"
case $t in
floor) sql="INSERT INTO floor SELECT 'dedupbench/inbox', 'evt-' || g FROM generate_series($a, $b) g";;
v1) sql="INSERT INTO v1 (scope, event_id, status, fingerprint, attempts, owner, lease_until, created_at, updated_at, expires_at)
 SELECT 'dedupbench/inbox', 'evt-' || g, 'SUCCEEDED', $FP, 1, '5f4dcc3b5aa765d61d8327deb882cf99', $TS, $TS, $TS, $TS + interval '7 days' FROM generate_series($a, $b) g";;
v2) sql="INSERT INTO v2 (expires_at, updated_at, attempts, status, scope, event_id, fingerprint)
 SELECT $TS + interval '7 days', $TS, 1, 'S', 'dedupbench/inbox', 'evt-' || g, decode($FP, 'hex') FROM generate_series($a, $b) g";;
esac
s=$(date +%s.%N)
psql -X -q $DB -c "$sql"
e=$(date +%s.%N)
echo "$(date +%T) build $t evt-$a..evt-$b: $(echo "$e - $s" | bc) s load=$(cut -d' ' -f1 /proc/loadavg)"
s=$(date +%s.%N)
psql -X -q $DB -c "VACUUM (ANALYZE) $t"
e=$(date +%s.%N)
echo "$(date +%T) vacuum analyze $t: $(echo "$e - $s" | bc) s; total bytes $(psql -X -At $DB -c "select pg_total_relation_size('$t')")"
