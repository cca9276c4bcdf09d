#!/bin/bash
# Device: correctness + timing of csrc/cuda/bwd_sm90.cu, and d64/d128 s8k timings of the variants in
# dev/variants (v0 = previous commit; noatom/noexp/nodq = current minus the dQ atomics / the exp /
# the whole dQ step), to place the time. Run from the repo root.
B=/tmp/sm90v; mkdir -p $B; O=${OUT:-$B}
F="-std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Icsrc -Icsrc/cuda -DFLASHATTN_EXT_SM90A"
S="dev/bwd_harness.cu csrc/cuda/bwd_sm80.cu csrc/cuda/bwd_simple.cu"
t0=$(date +%s)
nvcc $F $S csrc/cuda/bwd_sm90.cu -o $B/cur > $O/build_cur.log 2>&1 &
for v in $(ls dev/variants | sed "s/\.cu//"); do nvcc $F $S dev/variants/$v.cu -o $B/$v > $O/build_$v.log 2>&1 & done
wait
echo "build $(( $(date +%s) - t0 )) s"
timeout 150 $B/cur test > $O/test.log 2>&1
[ -n "$SANITIZE" ] && { timeout 60 compute-sanitizer --tool memcheck $B/cur small 2>&1 | tail -2; timeout 90 compute-sanitizer --tool racecheck $B/cur small 2>&1 | tail -2; }
echo "test: $(tail -1 $O/test.log)  ($(( $(date +%s) - t0 )) s)"; grep -v "^PASS" $O/test.log | head -10
for v in cur $(ls dev/variants | sed "s/\.cu//"); do
  [ -x $B/$v ] || { echo "$v: build failed"; tail -3 $O/build_$v.log; continue; }
  for cfg in "64 8192 0" "128 8192 0" "128 2048 1"; do echo "$v $(timeout 30 $B/$v time1 $cfg 0)"; done
done
timeout 60 $B/cur time > $O/time_cur.log 2>&1; cat $O/time_cur.log
echo "total $(( $(date +%s) - t0 )) s"
