#!/bin/bash
cd /tmp/v2lab
DB=postgres://postgres@127.0.0.1:5432/v2lab
rounds() { for rep in 1 2 3; do uptime; for v in floor v1 v2_inbox; do ./cpu1.sh $v batch 0; done; done; }
psql -X -q $DB -c "TRUNCATE floor, v1, v2"
echo "== 1,000,000 existing"
for t in floor v1 v2; do ./build.sh $t 1 1000000; done
rounds
echo "== 10,000,000 existing"
for t in floor v1 v2; do ./build.sh $t 1000001 10000000; done
rounds
