#!/bin/bash
# One device call that measures the forward: the extension and the harnesses built (dev/device_build.sh); the
# harness bench (static persistent order, then HARNESS_DYNAMIC=1, twice each, interleaved); dev/fwd_probe.py
# (ours and cuDNN alternating: do_bench, CUDA events, kernel durations); benchmarks/bench_gpu.py --only fwd
# (the full sweep); ncu of the d128 causal s2048 forward (speed of light, warp states, hot SASS lines).
# Run from the repo root: bash dev/fwd_probe.sh [steps: harness probe sweep ncu check]; logs under $OUT.
set -u
O=${OUT:-/tmp/fwd_probe}; mkdir -p $O
B=/tmp/fwd_probe_bin; mkdir -p $B
steps=${*:-harness probe sweep ncu}
. dev/device_build.sh
for step in $steps; do case $step in
harness)
    for r in 1 2; do
        echo "== static, run $r"; $B/fh bench
        echo "== HARNESS_DYNAMIC=1, run $r"; HARNESS_DYNAMIC=1 $B/fh bench
    done > $O/harness_bench.log 2>&1
    el "harness bench done" ;;
check)
    HARNESS_DYNAMIC=1 timeout 200 $B/fh check > $B/check_dyn.log 2>&1; el "check (dynamic) rc $?: $(tail -1 $B/check_dyn.log)"
    grep -v "^PASS" $B/check_dyn.log | tail -20 ;;
probe)
    timeout 200 python3 dev/fwd_probe.py --json $O/fwd_probe.json > $O/fwd_probe.log 2>&1; el "probe rc $?" ;;
sweep)
    timeout 260 python3 benchmarks/bench_gpu.py --only fwd --time-budget ${SWEEP_BUDGET:-200} --out $B/sweep > $O/sweep.log 2>&1
    el "sweep rc $?"; cp $B/sweep/results.json $O/sweep_results.json; cp $B/sweep/results.md $O/sweep_results.md ;;
ncu)
    # the causal s2048 d128 forward: bench's non-causal s2048 runs first (3 warm-up + 20 timed launches)
    HARNESS_SEQ=2048 timeout 150 ncu -k regex:flash_fwd_sm90 --launch-skip 23 -c 1 --set full --import-source yes \
        -o $B/fwd128c $B/fh bench 128 > $B/ncu.log 2>&1
    ncu -i $B/fwd128c.ncu-rep --print-details all > $O/ncu_fwd128_causal_s2k.txt 2>&1
    ncu -i $B/fwd128c.ncu-rep --page source --csv --print-source sass > $B/sass.csv 2>&1
    python3 dev/ncu_sass_hot.py $B/sass.csv 45 > $O/ncu_fwd128_causal_s2k_hot.txt 2>&1
    el "ncu done" ;;
esac; done
