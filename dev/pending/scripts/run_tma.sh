#!/bin/bash
# tma2: which of the three d128-only changes of FLASH_BWD90_TMA_LOADS loses (1 -> 3 swizzle, 3 -> 4 second dS stage, 4 -> 2 barrier)
export TMPDIR=/tmp/tma_ab
mkdir -p $TMPDIR
cd ab/tma2  # made by dev/pending/scripts/prep.sh
F=csrc/cuda/bwd_sm90.cu
on='s/define FLASH_BWD90_TMA_LOADS 0/define FLASH_BWD90_TMA_LOADS 1/'
st() { echo "$on;s/define FLASH_BWD90_TMA_D128_DS_STAGES 2/define FLASH_BWD90_TMA_D128_DS_STAGES $1/"; }
C="bh time1 128 2048 0 0;bh time1 128 8192 0 0;bh time1 128 2048 1 0;bh time1 128 8192 1 0;bh time1 128 512 0 0;bh time1 64 8192 0 0"
timeout 420 bash dev/ab_sed.sh 2 "$C" s2="$F:$on" s1="$F:$(st 1)" s3="$F:$(st 3)" s4="$F:$(st 4)" > $OUT/tma2_ab.log 2>&1
echo "rc $?" >> $OUT/tma2_ab.log
python3 dev/ab_table.py $OUT/tma2_ab.log | tee $OUT/tma2_table.txt
grep -c "FAIL" $OUT/tma2_ab.log
