#!/bin/bash
# single-row transactions, one backend: synchronous_commit on (rows/s is the fsync) and off (CPU of the statement + commit)
cd /tmp/v2lab
for rep in 1 2 3; do uptime; for v in fw v1w v2w_full v2w_inbox v2nw_inbox4; do
  for f in scripts/$v.single.call.sql; do sed -i 's/, [0-9]*);$/, 3000);/' $f; done
  echo -n "sync=on  "; SINGLE_N=3000 ./cpu1.sh $v single
  echo -n "sync=off "; PGOPTIONS="-c synchronous_commit=off" SINGLE_N=3000 ./cpu1.sh $v single
done; done
