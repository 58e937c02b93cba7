#!/bin/bash
cd /tmp/v2lab
while kill -0 24172 2>/dev/null; do sleep 2; done
VARS="floor inbox4 v2n_inbox4 v2_inbox v2ff100_inbox v1" 
for rep in 1 2 3 4 5; do uptime; for v in $VARS; do ./cpu1.sh $v batch; done; done
uptime
psql -X -q -At postgres://postgres@127.0.0.1:5432/v2lab -f bytes2.sql
