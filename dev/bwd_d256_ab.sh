#!/bin/bash
# bwd_d256_ab.sh: on the GPU machine, from the repo root (bash dev/bwd_d256_ab.sh): the one device call that decides
# launch.h's FLASH_BWD90_D256_DQ_TILED (issue 35 item 3: bwd_sm90.cu's d > 128 kernel adds dQ into a tile-ordered
# dq_accum, one float4 red.add per accumulator quad, no shuffles, no bounds; rows.cu's tiled preprocess and dQ
# postprocess). dev/ab_sed.sh builds the tree as it is (base: the switch off, main's kernels) and variant tiled (the
# switch's default flipped to 1; a header edit, so every object is rebuilt), 2 rounds of bwd_harness time, timedet
# and timev (the d256 rows: time d256 s512-s8192 causal 0/1, timedet d256 det 0/1, timev softcap and ALiBi causal
# at d256; the d64 / d128 rows run the same kernels in both and show the noise); then, on tiled: bwd_harness test
# bf16 / fp16 (dense, causal, GQA, strided, varlen with d200 / d256 of many tiles per sequence; det configs compared
# bitwise over runs), compute-sanitizer memcheck of bwd_harness small and racecheck of its d200 / d256 configs.
# Output under $OUT (default /tmp/d256_ab): ab.log, ab_table.txt, tiled_build.log (ptxas of the variant's
# bwd_sm90.cu and rows.cu), test_{bf16,fp16}.log, san_{memcheck,racecheck}.log.
set -o pipefail
export TMPDIR=/tmp
O=${OUT:-/tmp/d256_ab}
W=$TMPDIR/ab_sed
mkdir -p "$O"
bash dev/ab_sed.sh 2 "bh time;bh timedet;bh timev" \
    tiled='csrc/cuda/launch.h:s/^#define FLASH_BWD90_D256_DQ_TILED 0$/#define FLASH_BWD90_D256_DQ_TILED 1/' >"$O/ab.log" 2>&1
echo "ab rc $?"; grep -E "FAIL|WARN|error" "$O/ab.log" | head
cat "$W/tiled/bwd_sm90.log" "$W/tiled/rows.log" >"$O/tiled_build.log" 2>&1
[ -x "$W/tiled/bh" ] || { echo "tiled: no harness built"; exit 1; }
python3 dev/ab_table.py "$O/ab.log" | tee "$O/ab_table.txt"
for dt in bf16 fp16; do
    timeout 150 "$W/tiled/bh" test $dt >"$O/test_$dt.log" 2>&1
    echo "tiled test $dt rc $?: $(tail -1 "$O/test_$dt.log")"
    grep -v "^PASS" "$O/test_$dt.log" | head -8
done
timeout 150 compute-sanitizer --tool memcheck --print-limit 10 "$W/tiled/bh" small >"$O/san_memcheck.log" 2>&1
echo "tiled memcheck rc $?: $(grep -E 'ERROR SUMMARY' "$O/san_memcheck.log" | tail -1)"
timeout 120 compute-sanitizer --tool racecheck --print-limit 10 "$W/tiled/bh" small all "d=2" >"$O/san_racecheck.log" 2>&1
echo "tiled racecheck rc $?: $(grep -E 'RACECHECK SUMMARY' "$O/san_racecheck.log" | tail -1)"
