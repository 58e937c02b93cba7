#!/bin/bash
# usage: cpu1.sh variant mode [truncate] : one backend runs 782 batches of 256 (or 20000 single-row tx), each committed;
# prints that backend's CPU (utime+stime from /proc) per row and its wall rows/s
DB=postgres://postgres@127.0.0.1:5432/v2lab
v=$1; mode=$2; trunc=${3:-1}
t=$(cat scripts/$v.table)
[ "$trunc" = 1 ] && psql -X -q $DB -c "TRUNCATE $t"
psql -X -q $DB -c "CHECKPOINT"
if [ $mode = batch ]; then rows=$((782*256)); else rows=${SINGLE_N:-20000}; fi
tck=$(getconf CLK_TCK)
psql -X -q -At -v ON_ERROR_STOP=1 $DB > /dev/null <<SQL
SELECT pg_backend_pid() AS pid \gset
\setenv BPID :pid
\! awk '{print \$14+\$15}' /proc/\$BPID/stat > /tmp/v2lab/cpu.before
\! date +%s.%N > /tmp/v2lab/wall.before
\i scripts/$v.$mode.call.sql
\! date +%s.%N > /tmp/v2lab/wall.after
\! awk '{print \$14+\$15}' /proc/\$BPID/stat > /tmp/v2lab/cpu.after
SQL
c=$(( $(cat cpu.after) - $(cat cpu.before) ))
w=$(echo "$(cat wall.after) - $(cat wall.before)" | bc)
echo "$(date +%T) $v $mode cpu_us_per_row=$(echo "scale=2; $c*1000000/$tck/$rows" | bc) rows/s=$(echo "scale=0; $rows/$w" | bc) load=$(cut -d' ' -f1 /proc/loadavg)"
