#!/bin/bash
# Device check of the Hopper backward (csrc/cuda/bwd_sm90.cu) without torch: the wgmma layout check,
# the harness's correctness suite through the sm90 path and through the sm80 main kernel
# (FLASHATTN_EXT_DISABLE_SM90=1; also with the A100 tiles, FLASHATTN_EXT_SMEM_LIMIT=163 KB), sanitizers on the small configs (SANITIZE=1), then TFLOP/s
# sm80 main kernel -> sm90 main kernel. Run from the repo root; logs under $OUT.
B=/tmp/sm90; mkdir -p $B; O=${OUT:-$B}
F="-std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Icsrc -Icsrc/cuda -DFLASHATTN_EXT_SM90A"
S="dev/bwd_harness.cu csrc/cuda/bwd_sm80.cu csrc/cuda/bwd_sm90.cu csrc/cuda/bwd_simple.cu"
t0=$(date +%s)
nvcc $F dev/wgmma_check.cu -o $B/wc > $O/build_wc.log 2>&1 &
nvcc $F $S -o $B/h > $O/build_h.log 2>&1 &
wait
echo "build $(( $(date +%s) - t0 )) s"
timeout 20 $B/wc
timeout 150 $B/h test > $O/test_sm90.log 2>&1
echo "test sm90: $(tail -1 $O/test_sm90.log)"; grep -v "^PASS" $O/test_sm90.log | head -10
FLASHATTN_EXT_DISABLE_SM90=1 timeout 150 $B/h test bf16 > $O/test_sm80.log 2>&1
echo "test sm80 (bf16): $(tail -1 $O/test_sm80.log)"; grep -v "^PASS" $O/test_sm80.log | head -10
FLASHATTN_EXT_DISABLE_SM90=1 FLASHATTN_EXT_SMEM_LIMIT=$((163 * 1024)) timeout 150 $B/h test > $O/test_a100_tiles.log 2>&1
echo "test sm80, A100 tiles: $(tail -1 $O/test_a100_tiles.log)"; grep -v "^PASS" $O/test_a100_tiles.log | head -10
if [ -n "$SANITIZE" ]; then
    timeout 60 compute-sanitizer --tool memcheck $B/h small 2>&1 | tail -2
    timeout 90 compute-sanitizer --tool racecheck $B/h small 2>&1 | tail -2
fi
FLASHATTN_EXT_DISABLE_SM90=1 timeout 60 $B/h time > $O/time_sm80.log 2>&1
timeout 60 $B/h time > $O/time_sm90.log 2>&1
echo "time ($(( $(date +%s) - t0 )) s), TFLOP/s sm80 main -> sm90 main:"
FLASHATTN_EXT_DISABLE_SM90=1 FLASHATTN_EXT_SMEM_LIMIT=$((163 * 1024)) timeout 60 $B/h time > $O/time_a100_tiles.log 2>&1
echo "sm80 kernel with the A100 tiles (on the H200):"; cat $O/time_a100_tiles.log
paste $O/time_sm80.log $O/time_sm90.log | sed -E 's/bf16 (d= *[0-9]+) seqlen= *([0-9]+) b= *[0-9]+ h= *[0-9]+ (causal=[01]) (det=[01]) : +[0-9.]+ ms +([0-9.]+) TFLOP\/s/\1 s=\2 \3 \4 \5/g; s/\t.* ([0-9.]+)$/ -> \1/'
