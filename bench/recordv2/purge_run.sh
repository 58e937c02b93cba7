#!/bin/bash
# per rep and table: fill (1M expired + 1M live, VACUUM ANALYZE), 15 s of 256-row inbox batches (2 clients) without purge,
# then 15 s with the purge running alongside; p99 per batch from pgbench's per-transaction log
cd /tmp/v2lab
DB=postgres://postgres@127.0.0.1:5432/v2lab
Y=$(date -d yesterday +%Y%m%d)
p99() { cat logs/$1.* | awk '{print $3}' | sort -n | awk '{a[NR]=$1} END {printf "n=%d p50=%.1fms p99=%.1fms max=%.1fms", NR, a[int(NR*0.5)]/1000, a[int(NR*0.99)]/1000, a[NR]/1000}'; }
bench() { # name table
  rm -f logs/$1.*
  out=$(pgbench -n -c 2 -j 2 -T 15 -l --log-prefix=logs/$1 -f scripts/p_$2.sql $DB 2>&1)
  tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\) .*/\1/p')
  echo "$(date +%T) $1 rows/s=$(echo "$tps*256/1" | bc) $(p99 $1) load=$(cut -d' ' -f1 /proc/loadavg)"
}
purge() {
  s=$(date +%s.%N)
  case $1 in
    pv1|pv2) r=$(psql -X -At $DB -c "CALL purge_v1sql('$1')");;
    pv2x) r=$(psql -X -At $DB -c "CALL purge_sweep('pv2x', 32)");;
    pv2part) psql -X -q $DB -c "ALTER TABLE pv2part DETACH PARTITION pv2part_$Y CONCURRENTLY" && psql -X -q $DB -c "DROP TABLE pv2part_$Y"; r=dropped;;
  esac
  e=$(date +%s.%N)
  echo "$(date +%T) purge $1 deleted=$r took $(echo "$e - $s" | bc) s"
}
for rep in 1 2 3; do
  uptime
  for t in ${TABLES:-pv1 pv2 pv2x pv2part}; do
    ./purge_fill.sh $t
    bench ${t}_nopurge $t
    purge $t > logs/purge_$t.out &
    pp=$!
    bench ${t}_purge $t
    wait $pp; cat logs/purge_$t.out
  done
done
