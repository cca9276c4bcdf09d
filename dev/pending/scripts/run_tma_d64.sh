#!/bin/bash
# FLASH_BWD90_TMA_LOADS 3 (TMA loads at D = 64 only: +2 instantiations, 119 of 120) beside main, on the GPU machine:
#   bash dev/pending/scripts/run_tma_d64.sh time    bh time and bh timedet, 2 rounds interleaved (~5 min)
#   bash dev/pending/scripts/run_tma_d64.sh check   the tree with the knob at 3: ext + harness, pytest -k cuda,
#                                                   bh test all on both paths (~8 min)
# ab/tma2 is made here by dev/pending/scripts/prep.sh. Land (knob removed, TMA the d64 dense path) if every row of
# `time` is >= 0.99 and `check` is green.
F=csrc/cuda/bwd_sm90.cu
on='s/define FLASH_BWD90_TMA_LOADS 0/define FLASH_BWD90_TMA_LOADS 3/'
case ${1:-} in
time)
    export TMPDIR=/tmp/tma_d64
    mkdir -p $TMPDIR
    cd ab/tma2
    timeout 540 bash dev/ab_sed.sh 2 "bh time;bh timedet" tma3="$F:$on" > $OUT/tma3_ab.log 2>&1
    echo "rc $?" >> $OUT/tma3_ab.log
    python3 dev/ab_table.py $OUT/tma3_ab.log | tee $OUT/tma3_table.txt ;;
check)
    rm -rf /tmp/tma3_tree && mkdir -p /tmp/tma3_tree && cp -r ab/tma2/. /tmp/tma3_tree/ && cd /tmp/tma3_tree
    sed -i "$on" $F
    export B=/tmp/tma3
    bash dev/device.sh build ext harness > $OUT/tma3_build.log 2>&1 || { tail -20 $OUT/tma3_build.log; exit 1; }
    (timeout 400 /tmp/tma3/bh test all > $OUT/tma3_bh90.log 2>&1; echo "bh sm90 rc $?: $(tail -1 $OUT/tma3_bh90.log)";
     FLASHATTN_EXT_DISABLE_SM90=1 timeout 100 /tmp/tma3/bh test bf16 > $OUT/tma3_bh80.log 2>&1;
     echo "bh sm80 bf16 rc $?: $(tail -1 $OUT/tma3_bh80.log)") &
    PYTHONPATH=$PWD timeout 420 python3 -m pytest tests -q -rf --maxfail=30 -n 12 -k cuda -p no:cacheprovider \
        > $OUT/tma3_pytest.log 2>&1
    echo "pytest rc $?: $(tail -1 $OUT/tma3_pytest.log)"
    wait
    grep -h -E "^FAILED|FAIL " $OUT/tma3_pytest.log $OUT/tma3_bh*.log | head -20 ;;
*) echo "usage: run_tma_d64.sh time|check"; exit 2 ;;
esac
