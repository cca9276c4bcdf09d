#!/bin/bash
# Device check of the d256 candidate (dev/bwd_sm90_d256/bwd_sm90.patch on csrc/cuda/bwd_sm90.cu) against the committed
# csrc/cuda/bwd_sm90.cu: harness correctness suite (432 configs) through the candidate, then TFLOP/s
# committed -> candidate. Every step has a timeout and line-buffered logs, so a hang still leaves a trace.
# Run from the repo root: bash dev/bwd_sm90_d256/run.sh   (SANITIZE=1 adds memcheck + racecheck)
B=/tmp/d256; mkdir -p $B; O=${OUT:-$B}
F="-std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Icsrc -Icsrc/cuda -DFLASHATTN_EXT_SM90A"
S="dev/bwd_harness.cu csrc/cuda/bwd_sm80.cu csrc/cuda/bwd_simple.cu"
t0=$(date +%s)
patch -s -o $B/bwd_sm90.cu csrc/cuda/bwd_sm90.cu < dev/bwd_sm90_d256/bwd_sm90.patch || { echo "patch does not apply"; exit 1; }
nvcc $F $S $B/bwd_sm90.cu -o $B/cand > $O/build_cand.log 2>&1 &
nvcc $F $S csrc/cuda/bwd_sm90.cu -o $B/orig > $O/build_orig.log 2>&1 &
wait
[ -x $B/cand ] || { echo "candidate build failed"; tail -20 $O/build_cand.log; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
echo "one config first: $(timeout 20 stdbuf -oL $B/cand time1 256 2048 0 0 2>&1 || echo 'TIMEOUT/FAIL (hang?)')"
timeout 120 stdbuf -oL $B/cand test > $O/test_cand.log 2>&1
echo "test rc=$?: $(tail -1 $O/test_cand.log)  ($(( $(date +%s) - t0 )) s)"; grep -v "^PASS" $O/test_cand.log | head -10
if [ -n "$SANITIZE" ]; then
    timeout 90 compute-sanitizer --tool memcheck $B/cand small 2>&1 | tail -2
    timeout 120 compute-sanitizer --tool racecheck $B/cand small 2>&1 | tail -2
fi
for v in orig cand; do timeout 60 stdbuf -oL $B/$v time > $O/time_$v.log 2>&1; done
echo "TFLOP/s committed -> candidate ($(( $(date +%s) - t0 )) s):"
paste $O/time_orig.log $O/time_cand.log | sed -E 's/bf16 (d= *[0-9]+) seqlen= *([0-9]+) b= *[0-9]+ h= *[0-9]+ (causal=[01]) (det=[01]) : +[0-9.]+ ms +([0-9.]+) TFLOP\/s/\1 s=\2 \3 \4 \5/g; s/\t.* ([0-9.]+)$/ -> \1/'
