#!/bin/bash
# One device call (about 6 min), from the repo root; logs under $OUT:
# 1. the racecheck probe's 8 variants (which synchronization racecheck models);
# 2. the candidate patches of csrc/cuda/bwd_sm90.cu, alone and together: each runs the harness's 432
#    configs plus memcheck and racecheck on its small configs, then all are timed beside the committed
#    file (c0).
B=/tmp/candidates; mkdir -p $B
nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a dev/racecheck_probe.cu -o $B/probe || exit 1
for v in 0 1 2 3 4 5 6 7; do
    echo "$(timeout 20 $B/probe $v) | racecheck: $(timeout 90 compute-sanitizer --tool racecheck $B/probe $v 2>&1 | grep SUMMARY)"
done
for c in mbar maskbranch; do
    mkdir -p $B/$c && patch -s -o $B/$c/bwd_sm90.cu csrc/cuda/bwd_sm90.cu < dev/candidates/$c.patch || exit 1
done
mkdir -p $B/both && cp $B/mbar/bwd_sm90.cu $B/both/ && patch -s $B/both/bwd_sm90.cu < dev/candidates/maskbranch.patch || exit 1
SANITIZE=1 bash dev/cand_run.sh $B/mbar/bwd_sm90.cu $B/maskbranch/bwd_sm90.cu $B/both/bwd_sm90.cu
