#!/bin/bash
# run_i34a found ab/i34 0.58-0.94x main on the sm80 path of the H200 (bh timedet). Which patch: each alone
# (small = bwd80 main small tiles, dq = dQ hook runtime, rows = rows runtime) on the sm80 path; then i34x (decode +
# dq + rows, no small tiles) on the sm90 path (bh time) and its correctness on both.
export TMPDIR=/tmp/split_ab
mkdir -p $TMPDIR
FLASHATTN_EXT_DISABLE_SM90=1 timeout 300 bash dev/ab_sed.sh 2 "bh timedet" small=@ab/small dq=@ab/dq rows=@ab/rows > $OUT/split80.log 2>&1
echo "rc $?" >> $OUT/split80.log
python3 dev/ab_table.py $OUT/split80.log > $OUT/split80_table.txt 2>&1; cat $OUT/split80_table.txt
export TMPDIR=/tmp/i34x_ab
mkdir -p $TMPDIR
timeout 170 bash dev/ab_sed.sh 2 "bh time" i34x=@ab/i34x > $OUT/i34x90.log 2>&1
echo "rc $?" >> $OUT/i34x90.log
python3 dev/ab_table.py $OUT/i34x90.log > $OUT/i34x90_table.txt 2>&1; cat $OUT/i34x90_table.txt
B=$TMPDIR/ab_sed/i34x
(timeout 50 $B/bh test all > $OUT/i34x_bh90.log 2>&1; echo "bh test all sm90 rc $?: $(tail -1 $OUT/i34x_bh90.log)")
(FLASHATTN_EXT_DISABLE_SM90=1 timeout 50 $B/bh test all > $OUT/i34x_bh80.log 2>&1; echo "bh test all sm80 rc $?: $(tail -1 $OUT/i34x_bh80.log)")
grep -h FAIL $OUT/i34x_bh90.log $OUT/i34x_bh80.log | head
