#!/bin/bash
# run_split.sh's trees were identical to main (git apply --include with --directory applied nothing), so its
# 1.00x per patch meant nothing. Redo with trees made by `patch -p1` and checked by diff -rq: each issue-34
# patch alone on the sm80 path (bh timedet, 2 rounds), then the rows patch (the only one the sm90 backward
# runs) on the sm90 path (bh time, 1 round, the same binaries): ~400 s. The correctness of the trees that keep
# their speed (bh test bf16 on both paths) in the next call: run_split2_check.sh.
export TMPDIR=/tmp/split2
mkdir -p $TMPDIR
for n in small dq rows; do diff -rq csrc ab/$n/csrc | grep -q differ || { echo "ab/$n is main"; exit 1; }; done
FLASHATTN_EXT_DISABLE_SM90=1 timeout 330 bash dev/ab_sed.sh 2 "bh timedet" small=@ab/small dq=@ab/dq rows=@ab/rows > $OUT/split80.log 2>&1
echo "rc $?" >> $OUT/split80.log
python3 dev/ab_table.py $OUT/split80.log > $OUT/split80_table.txt 2>&1; cat $OUT/split80_table.txt
W=$TMPDIR/ab_sed
for r in 0; do for n in rows base; do echo "== round $r $n: bh time"; timeout 100 $W/$n/bh time || echo "FAILED rc $?"; done; done > $OUT/rows90.log 2>&1
python3 dev/ab_table.py $OUT/rows90.log > $OUT/rows90_table.txt 2>&1; cat $OUT/rows90_table.txt
