#!/bin/bash
# One device call (about 5 min), from the repo root; logs under $OUT:
# 1. the racecheck probe's 8 variants (which synchronization racecheck models);
# 2. all candidate patches of csrc/cuda/bwd_sm90.cu applied together: the harness's 432 configs,
#    memcheck and racecheck on its small configs, TFLOP/s beside the committed file;
# 3. each candidate alone, timed beside the committed file (c0 -> mbar -> maskbranch -> fastload -> uniform -> stmatrix -> d256order).
B=/tmp/candidates; mkdir -p $B; O=${OUT:-$B}
nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a dev/racecheck_probe.cu -o $B/probe || exit 1
for v in 0 1 2 3 4 5 6 7; do
    echo "$(timeout 20 $B/probe $v) | racecheck: $(timeout 90 compute-sanitizer --tool racecheck $B/probe $v 2>&1 | grep SUMMARY)"
done
CANDS="mbar maskbranch fastload uniform stmatrix d256order"
mkdir -p $B/all && cp csrc/cuda/bwd_sm90.cu $B/all/
for c in $CANDS; do
    mkdir -p $B/$c && patch -s -o $B/$c/bwd_sm90.cu csrc/cuda/bwd_sm90.cu < dev/candidates/$c.patch || exit 1
    patch -s $B/all/bwd_sm90.cu < dev/candidates/$c.patch || exit 1
done
echo "== all candidates together"
mkdir -p $O/all && OUT=$O/all SANITIZE=1 bash dev/cand_run.sh $B/all/bwd_sm90.cu
echo "== each alone (timings only)"
mkdir -p $O/each && OUT=$O/each CAND_TEST=0 bash dev/cand_run.sh $(for c in $CANDS; do echo $B/$c/bwd_sm90.cu; done)
