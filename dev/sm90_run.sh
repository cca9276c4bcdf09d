#!/bin/bash
# Device check of the sm90 backward (csrc/cuda/bwd_sm90.cu): wgmma layout check, the harness's
# correctness suite through the sm90 path, sanitizers on the small configs, then TFLOP/s with the
# sm80 main kernel (FLASHATTN_EXT_DISABLE_SM90=1) -> with the sm90 one. Run from the repo root.
B=/tmp/sm90; mkdir -p $B; O=${OUT:-$B}
F="-std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Icsrc -Icsrc/cuda -DFLASHATTN_EXT_SM90A"
S="dev/bwd_harness.cu csrc/cuda/bwd_sm80.cu csrc/cuda/bwd_sm90.cu csrc/cuda/bwd_simple.cu"
t0=$(date +%s)
nvcc $F dev/wgmma_check.cu -o $B/wc > $O/build_wc.log 2>&1 &
nvcc $F -DWGMMA_MN_SWAP_TEST dev/wgmma_check.cu -o $B/wcs > $O/build_wcs.log 2>&1 &
nvcc $F $S -o $B/h > $O/build_h.log 2>&1 &
nvcc $F -DWGMMA_MN_SWAP_TEST $S -o $B/hs > $O/build_hs.log 2>&1 &
wait
echo "build $(( $(date +%s) - t0 )) s"; tail -3 $O/build_h.log
echo -n "as written: "; timeout 20 $B/wc
echo -n "LBO/SBO swapped: "; timeout 20 $B/wcs
H=$B/h
if ! timeout 20 $B/wc | grep -q PASS && timeout 20 $B/wcs | grep -q PASS; then H=$B/hs; echo "USING SWAPPED"; fi
timeout 150 $H test > $O/test.log 2>&1
echo "test: $(tail -1 $O/test.log)  ($(( $(date +%s) - t0 )) s)"; grep -v "^PASS" $O/test.log | head -20
grep "^PASS bf16 d=128" $O/test.log | head -3
if [ -n "$SANITIZE" ]; then
    timeout 60 compute-sanitizer --tool memcheck $H small 2>&1 | tail -2
    timeout 90 compute-sanitizer --tool racecheck $H small 2>&1 | tail -2
fi
FLASHATTN_EXT_DISABLE_SM90=1 timeout 60 $H time > $O/time_sm80.log 2>&1
timeout 60 $H time > $O/time_sm90.log 2>&1
echo "time ($(( $(date +%s) - t0 )) s), TFLOP/s sm80 main -> sm90 main:"
paste $O/time_sm80.log $O/time_sm90.log | sed -E 's/bf16 (d= *[0-9]+) seqlen= *([0-9]+) b= *[0-9]+ h= *[0-9]+ (causal=[01]) (det=[01]) : +[0-9.]+ ms +([0-9.]+) TFLOP\/s/\1 s=\2 \3 \4 \5/g; s/\t.* ([0-9.]+)$/ -> \1/'
