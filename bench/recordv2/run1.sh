#!/bin/bash
# usage: run1.sh variant mode(batch|single) [truncate=1]
# batch: 2 clients x 391 transactions x 256 rows = 200,192 rows; single: 2 clients x 10 s
DB=postgres://postgres@127.0.0.1:5432/v2lab
v=$1; mode=$2; trunc=${3:-1}
t=$(cat scripts/$v.table)
if [ "$trunc" = 1 ]; then psql -X -q $DB -c "TRUNCATE $t" ; fi
psql -X -q $DB -c "CHECKPOINT"
if [ $mode = batch ]; then args="-t 391"; else args="-T 10"; fi
[ $mode = single ] && cl="-c 8 -j 2" || cl="-c 2 -j 2"
out=$(pgbench -n $cl $args -f scripts/$v.$mode.sql $DB 2>&1)
tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\) .*/\1/p')
lat=$(echo "$out" | sed -n 's/^latency average = \([0-9.]*\) ms/\1/p')
if [ $mode = batch ]; then rows=$(echo "$tps*256" | bc); else rows=$tps; fi
echo "$(date +%T) $v $mode rows/s=$rows lat_ms=$lat load=$(cut -d' ' -f1 /proc/loadavg)"
echo "$out" | grep -i "error\|abort" | head -3
