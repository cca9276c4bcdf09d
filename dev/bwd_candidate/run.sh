#!/bin/bash
# Device check of the candidate backward (dev/bwd_candidate/bwd_sm80.cu) against the committed one.
# Run on the device from the repo root: bash dev/bwd_candidate/run.sh
# (RACECHECK=1 adds compute-sanitizer racecheck/memcheck on the `small` configs, ~1 min more.)
B=/tmp/bwdc; mkdir -p $B; O=${OUT:-$B}
F="-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc -Icsrc/cuda"
S="dev/bwd_harness.cu csrc/cuda/bwd_simple.cu"
t0=$(date +%s)
nvcc $F $S dev/bwd_candidate/bwd_sm80.cu -o $B/cand > $O/build_cand.log 2>&1 &
nvcc $F $S csrc/cuda/bwd_sm80.cu -o $B/orig > $O/build_orig.log 2>&1 &
wait
[ -x $B/cand ] || { echo "candidate build failed"; tail -20 $O/build_cand.log; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
$B/cand test > $O/test_cand.log 2>&1
echo "test: $(tail -1 $O/test_cand.log)  ($(( $(date +%s) - t0 )) s)"; grep -v "^PASS" $O/test_cand.log | head -20
grep "^PASS bf16 d=128" $O/test_cand.log | head -3
if [ -n "$RACECHECK" ]; then
    compute-sanitizer --tool racecheck $B/cand small 2>&1 | tail -3
    compute-sanitizer --tool memcheck $B/cand small 2>&1 | tail -3
fi
for v in orig cand; do timeout 90 $B/$v time > $O/time_$v.log 2>&1; done
echo "time ($(( $(date +%s) - t0 )) s), TFLOP/s orig -> cand:"
paste $O/time_orig.log $O/time_cand.log | sed -E 's/bf16 (d= *[0-9]+) seqlen= *([0-9]+) b= *[0-9]+ h= *[0-9]+ (causal=[01]) (det=[01]) : +[0-9.]+ ms +([0-9.]+) TFLOP\/s/\1 s=\2 \3 \4 \5/g; s/\t.* ([0-9.]+)$/ -> \1/'
