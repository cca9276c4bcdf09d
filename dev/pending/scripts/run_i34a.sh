#!/bin/bash
# issue 34's four instantiation patches together (ab/i34, made by prep.sh) beside main, speed: the sm80 path
# (FLASHATTN_EXT_DISABLE_SM90=1: small main tiles, dQ kernel, row kernels) by bh timedet, the decode by
# fh decode-bench / paged-bench; 2 rounds interleaved. Then bh test all of ab/i34 on the sm80 path.
export TMPDIR=/tmp/i34_ab FLASHATTN_EXT_DISABLE_SM90=1
mkdir -p $TMPDIR
timeout 420 bash dev/ab_sed.sh 2 "bh timedet;fh decode-bench;fh paged-bench" i34=@ab/i34 > $OUT/i34a_ab.log 2>&1
echo "rc $?" >> $OUT/i34a_ab.log
python3 dev/ab_table.py $OUT/i34a_ab.log | tee $OUT/i34a_table.txt
timeout 120 $TMPDIR/ab_sed/i34/bh test all > $OUT/i34a_bh_sm80.log 2>&1; echo "bh test sm80 rc $?: $(tail -1 $OUT/i34a_bh_sm80.log)"
grep -v "^PASS" $OUT/i34a_bh_sm80.log | head
