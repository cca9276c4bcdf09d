#!/bin/bash
# ab/i34 on the sm90 path: correctness (bh test all, fh check) and bh time beside main (the row kernels), 2 rounds
export TMPDIR=/tmp/i34_ab
mkdir -p $TMPDIR
timeout 400 bash dev/ab_sed.sh 2 "bh time" i34=@ab/i34 > $OUT/i34b_ab.log 2>&1
echo "rc $?" >> $OUT/i34b_ab.log
python3 dev/ab_table.py $OUT/i34b_ab.log | tee $OUT/i34b_table.txt
timeout 90 $TMPDIR/ab_sed/i34/bh test all > $OUT/i34b_bh.log 2>&1; echo "bh test rc $?: $(tail -1 $OUT/i34b_bh.log)"
timeout 90 $TMPDIR/ab_sed/i34/fh check > $OUT/i34b_fh.log 2>&1; echo "fh check rc $?: $(tail -1 $OUT/i34b_fh.log)"
grep -v "^PASS" $OUT/i34b_bh.log | head; grep -i "fail" $OUT/i34b_fh.log | head
