#!/bin/bash
# Device check of the CUDA backward without torch (dev/bwd_harness.cu through launch.cu's
# flash_bwd_cuda): the wgmma layout check, the harness's correctness suite (dense, every variant and
# the varlen batches) through the sm90 main kernel, through the sm80 main kernel
# (FLASHATTN_EXT_DISABLE_SM90=1) and through its A100 tiles (FLASHATTN_EXT_SMEM_LIMIT=163 KB),
# sanitizers on the small configs (varlen ones included), then TFLOP/s: sm80 main kernel -> sm90 main
# kernel, each variant, and dense against varlen batches.
# Run from the repo root; logs under $OUT. Steps (default: all but varlen, in this order):
#   bash dev/sm90_run.sh [build] [test] [sanitize] [time] [varlen]
# varlen: only the varlen configs (every dtype) through the three paths, and their timing (quick).
# The binaries go to dev/bin/sm90 (git-ignored), so a later call on the same machine can skip build.
B=dev/bin/sm90; mkdir -p $B; O=${OUT:-$B}
F="-std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Icsrc -Icsrc/cuda -DFLASHATTN_EXT_SM90A"
SRC="dev/bwd_harness.cu csrc/cuda/launch.cu csrc/cuda/bwd_sm80.cu csrc/cuda/bwd_sm90.cu csrc/cuda/bwd_simple.cu
     csrc/cuda/fwd_sm80.cu csrc/cuda/fwd_sm90.cu csrc/cuda/fwd_decode.cu csrc/cuda/fwd_simple.cu"
STEPS=${*:-build test sanitize time}
A100_SMEM=$((163 * 1024))
t0=$(date +%s)
for step in $STEPS; do
case $step in
build)
    nvcc $F dev/wgmma_check.cu -o $B/wc > $O/build_wc.log 2>&1 &
    objs=""
    for f in $SRC; do
        o=$B/$(basename $f .cu).o; objs="$objs $o"
        nvcc $F -c $f -o $o > $O/build_$(basename $f .cu).log 2>&1 &
    done
    wait
    nvcc $F $objs -o $B/h > $O/build_link.log 2>&1 || { cat $O/build_*.log | grep -v "^$" | head -30; exit 1; }
    echo "build $(( $(date +%s) - t0 )) s"
    ;;
test)
    timeout 20 $B/wc
    timeout 400 $B/h test > $O/test_sm90.log 2>&1
    echo "test sm90 main kernel: $(tail -1 $O/test_sm90.log) ($(grep -c '^PASS.*varlen' $O/test_sm90.log) varlen passed)"
    grep -v "^PASS" $O/test_sm90.log | head -10
    FLASHATTN_EXT_DISABLE_SM90=1 timeout 400 $B/h test > $O/test_sm80.log 2>&1
    echo "test sm80 main kernel: $(tail -1 $O/test_sm80.log) ($(grep -c '^PASS.*varlen' $O/test_sm80.log) varlen passed)"
    grep -v "^PASS" $O/test_sm80.log | head -10
    FLASHATTN_EXT_DISABLE_SM90=1 FLASHATTN_EXT_SMEM_LIMIT=$A100_SMEM timeout 400 $B/h test bf16 > $O/test_a100_tiles.log 2>&1
    echo "test sm80, A100 tiles (bf16): $(tail -1 $O/test_a100_tiles.log)"; grep -v "^PASS" $O/test_a100_tiles.log | head -10
    echo "tests done at $(( $(date +%s) - t0 )) s"
    ;;
sanitize)
    for env in "" "FLASHATTN_EXT_DISABLE_SM90=1"; do
        echo "memcheck ${env:-sm90}: $(env $env timeout 120 compute-sanitizer --tool memcheck $B/h small 2>&1 | tail -1)"
        echo "racecheck ${env:-sm90}: $(env $env timeout 200 compute-sanitizer --tool racecheck $B/h small 2>&1 | tail -1)"
    done
    ;;
time)
    FLASHATTN_EXT_DISABLE_SM90=1 timeout 90 $B/h time > $O/time_sm80.log 2>&1
    timeout 90 $B/h time > $O/time_sm90.log 2>&1
    echo "time ($(( $(date +%s) - t0 )) s), TFLOP/s sm80 main -> sm90 main:"
    paste $O/time_sm80.log $O/time_sm90.log | sed -E 's/bf16 (d= *[0-9]+) seqlen= *([0-9]+) b= *[0-9]+ h= *[0-9]+ (causal=[01] det=[01]) *: +[0-9.]+ ms +([0-9.]+) TFLOP\/s \(visible [0-9.]+\)/\1 s=\2 \3 \4/g; s/\t.* ([0-9.]+)$/ -> \1/'
    FLASHATTN_EXT_DISABLE_SM90=1 FLASHATTN_EXT_SMEM_LIMIT=$A100_SMEM timeout 90 $B/h time > $O/time_a100_tiles.log 2>&1
    echo "sm80 kernel with the A100 tiles (on the H200):"; cat $O/time_a100_tiles.log
    echo "variants, sm90 main kernel:"; timeout 120 $B/h timev 2>&1 | tee $O/timev_sm90.log
    echo "variants, sm80 main kernel:"; FLASHATTN_EXT_DISABLE_SM90=1 timeout 120 $B/h timev 2>&1 | tee $O/timev_sm80.log
    echo "dense vs varlen, sm90 main kernel:"; timeout 120 $B/h timevl 2>&1 | tee $O/timevl_sm90.log
    ;;
varlen)
    for path in "sm90:" "sm80:FLASHATTN_EXT_DISABLE_SM90=1" \
                "a100_tiles:FLASHATTN_EXT_DISABLE_SM90=1 FLASHATTN_EXT_SMEM_LIMIT=$A100_SMEM"; do
        name=${path%%:*}; log=$O/test_varlen_$name.log
        env ${path#*:} timeout 300 $B/h test all varlen > $log 2>&1
        echo "varlen, $name main kernel: $(tail -1 $log)"; grep -v "^PASS" $log | head -10
    done
    echo "dense vs varlen, sm90 main kernel:"; timeout 120 $B/h timevl 2>&1 | tee $O/timevl_sm90.log
    echo "varlen done at $(( $(date +%s) - t0 )) s"
    ;;
esac
done
