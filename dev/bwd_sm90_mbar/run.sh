#!/bin/bash
# One device call (about 3 min): the racecheck probe's 8 variants (which synchronization racecheck
# models), then the mbarrier candidate of bwd_sm90.cu: the harness's 432 configs, memcheck and
# racecheck on its small configs, TFLOP/s committed -> candidate. Run from the repo root; logs under $OUT.
B=/tmp/mbar; mkdir -p $B
nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a dev/racecheck_probe.cu -o $B/probe || exit 1
for v in 0 1 2 3 4 5 6 7; do
    echo "$(timeout 20 $B/probe $v) | racecheck: $(timeout 90 compute-sanitizer --tool racecheck $B/probe $v 2>&1 | grep SUMMARY)"
done
patch -s -o $B/bwd_sm90.cu csrc/cuda/bwd_sm90.cu < dev/bwd_sm90_mbar/bwd_sm90.patch || { echo "patch does not apply"; exit 1; }
SANITIZE=1 bash dev/cand_run.sh $B/bwd_sm90.cu
