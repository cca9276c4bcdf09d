#!/bin/bash
# FLASH_BWD90_TMA_LOADS 4 (the TMA producer warp 0 of a fourth warpgroup, the dQ reducer's 4 warps kept; MMA
# warpgroups at 232 registers; compiled here: the dense TMA kernels spill 12 B at 232) beside main and beside value 1,
# both with d64's arrangement at d128 (FLASH_BWD90_TMA_D128_DS_STAGES 1), bh time1 at d128 / d64, 2 rounds; then bh
# test bf16 of the value-4 binary (its new role split). ab/tma2 from dev/pending/scripts/prep.sh. ~7 min.
export TMPDIR=/tmp/tma_wg4
mkdir -p $TMPDIR
cd ab/tma2
F=csrc/cuda/bwd_sm90.cu
v() { echo "s/define FLASH_BWD90_TMA_LOADS 0/define FLASH_BWD90_TMA_LOADS $1/;s/define FLASH_BWD90_TMA_D128_DS_STAGES 2/define FLASH_BWD90_TMA_D128_DS_STAGES 1/"; }
C="bh time1 128 2048 0 0;bh time1 128 8192 0 0;bh time1 128 2048 1 0;bh time1 128 8192 1 0;bh time1 128 512 0 0;bh time1 64 8192 0 0;bh time1 64 2048 1 0"
timeout 480 bash dev/ab_sed.sh 2 "$C" w1="$F:$(v 1)" w4="$F:$(v 4)" > $OUT/tma_wg4_ab.log 2>&1
echo "rc $?" >> $OUT/tma_wg4_ab.log
python3 dev/ab_table.py $OUT/tma_wg4_ab.log | tee $OUT/tma_wg4_table.txt
timeout 100 $TMPDIR/ab_sed/w4/bh test bf16 > $OUT/tma_wg4_test.log 2>&1
echo "w4 bh test bf16 rc $?: $(tail -1 $OUT/tma_wg4_test.log)"; grep -v "^PASS" $OUT/tma_wg4_test.log | head -5
