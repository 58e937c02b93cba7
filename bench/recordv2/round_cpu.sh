#!/bin/bash
cd /tmp/v2lab
VARS=${VARS:-"floor floor_dc v1 v1_nothing v1_nox_nothing v2_full v2t_full v2btree_full v2nox_full v2ff100_full v2part_full v2sid_full v2hash_full v2_inbox v2_inbox_nothing v2ff100_inbox v2n_inbox4 v2n_inbox4_nothing inbox4"}
MODE=${MODE:-batch}
for rep in 1 2 3; do
  uptime
  for v in $VARS; do ./cpu1.sh $v $MODE; done
done
