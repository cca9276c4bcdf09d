#!/bin/bash
# issue 34's four instantiation patches together (ab/i34, made by prep.sh) beside main: speed on the sm80 path
# (FLASHATTN_EXT_DISABLE_SM90=1: small main tiles, the dQ kernel, the row kernels) by bh timedet, the decode by
# fh decode-bench, 2 rounds interleaved; then correctness of ab/i34: bh test bf16 on both paths, fh check.
export TMPDIR=/tmp/i34_ab
mkdir -p $TMPDIR
FLASHATTN_EXT_DISABLE_SM90=1 timeout 330 bash dev/ab_sed.sh 2 "bh timedet;fh decode-bench" i34=@ab/i34 > $OUT/i34a_ab.log 2>&1
echo "rc $?" >> $OUT/i34a_ab.log
python3 dev/ab_table.py $OUT/i34a_ab.log > $OUT/i34a_table.txt 2>&1; cat $OUT/i34a_table.txt | head -40
B=$TMPDIR/ab_sed/i34
(FLASHATTN_EXT_DISABLE_SM90=1 timeout 100 $B/bh test bf16 > $OUT/i34a_bh_sm80.log 2>&1; echo "bh test bf16 sm80 rc $?: $(tail -1 $OUT/i34a_bh_sm80.log)")
(timeout 80 $B/bh test bf16 > $OUT/i34a_bh_sm90.log 2>&1; echo "bh test bf16 sm90 rc $?: $(tail -1 $OUT/i34a_bh_sm90.log)")
(timeout 60 $B/fh check > $OUT/i34a_fh.log 2>&1; echo "fh check rc $?: $(tail -1 $OUT/i34a_fh.log)")
grep -h "FAIL" $OUT/i34a_bh_sm80.log $OUT/i34a_bh_sm90.log $OUT/i34a_fh.log | head
grep -A14 "round 1 i34: fh decode" $OUT/i34a_ab.log | head -16; grep -A14 "round 1 base: fh decode" $OUT/i34a_ab.log | head -16
