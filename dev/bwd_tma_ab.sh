#!/bin/bash
# bwd_tma_ab.sh: on the GPU machine, from the repo root (bash dev/bwd_tma_ab.sh): the one device call that decides
# bwd_sm90.cu's FLASH_BWD90_TMA_DQ (the dQ reducer by bulk tensor reduce-adds, branch i35-bwd's wip). dev/ab_sed.sh
# builds the tree as it is (base: the switch off, main's kernels) and variant tma (the switch's default flipped to
# 1), 2 rounds of bwd_harness time, timedet and timev; then, on tma: bwd_harness test bf16 / fp16 (dense and varlen
# configs; det configs compared bitwise over runs) and compute-sanitizer memcheck / racecheck of bwd_harness small.
# Logs under $OUT (default /tmp/tma_ab).
set -o pipefail
export TMPDIR=/tmp
O=${OUT:-/tmp/tma_ab}
W=$TMPDIR/ab_sed
mkdir -p "$O"
bash dev/ab_sed.sh 2 "bh time;bh timedet;bh timev" \
    tma='csrc/cuda/bwd_sm90.cu:s/^#define FLASH_BWD90_TMA_DQ 0$/#define FLASH_BWD90_TMA_DQ 1/' >"$O/ab.log" 2>&1
echo "ab rc $?"; grep -E "FAIL|WARN|error" "$O/ab.log" | head
cp "$W/tma/bwd_sm90.log" "$O/tma_bwd_sm90_build.log"
[ -x "$W/tma/bh" ] || { echo "tma: no harness built"; exit 1; }
python3 dev/ab_table.py "$O/ab.log" | tee "$O/ab_table.txt"
for dt in bf16 fp16; do
    timeout 150 "$W/tma/bh" test $dt >"$O/test_tma_$dt.log" 2>&1
    echo "tma test $dt rc $?: $(tail -1 "$O/test_tma_$dt.log")"
    grep -v "^PASS" "$O/test_tma_$dt.log" | head -8
done
for tool in memcheck racecheck; do
    timeout 200 compute-sanitizer --tool $tool --print-limit 10 "$W/tma/bh" small >"$O/san_tma_$tool.log" 2>&1
    echo "tma $tool rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$O/san_tma_$tool.log" | tail -1)"
done
