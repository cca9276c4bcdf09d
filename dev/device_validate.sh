#!/bin/bash
# One device call that validates a tree: the extension (sm_90a) and both torch-free harnesses built side by side,
# then `pytest tests -k cuda` beside the harnesses' suites (bwd_harness `test`, fwd_harness `check`), then
# compute-sanitizer memcheck and racecheck (--det) over scripts/sanitize_small.py. Optional steps after those:
#   ncu   Nsight Compute of the backward at d128 (s8192 main kernel: full set, stall reasons per SASS line;
#         s512 and s8192: the duration of each backward kernel, pre / main / post);
#   fwdbench  the forward harness's bench and `variants 128`.
# Run from the repo root: bash dev/device_validate.sh [ncu]; at most 8 logs under $OUT.
set -u
O=${OUT:-/tmp/validate}; mkdir -p $O
B=/tmp/validate_bin; mkdir -p $B
. dev/device_build.sh
( timeout 300 $B/bh test > $B/bh_test.log 2>&1; echo "bwd_harness test rc $?: $(tail -1 $B/bh_test.log)"
  timeout 200 $B/fh check > $B/fh_check.log 2>&1; echo "fwd_harness check rc $?: $(tail -1 $B/fh_check.log)" ) &
PYTHONUNBUFFERED=1 timeout 330 python3 -m pytest tests -q -rf --maxfail=20 -n 12 -k cuda -p no:cacheprovider > $O/pytest.log 2>&1
el "pytest rc $?: $(tail -1 $O/pytest.log)"
wait
cat $B/bh_test.log $B/fh_check.log | grep -v "^PASS" > $O/harness_fail_lines.log
for tool in memcheck racecheck; do
    a=; [ $tool = racecheck ] && a=--det
    PYTHONUNBUFFERED=1 timeout 150 compute-sanitizer --tool $tool --print-limit 20 python3 scripts/sanitize_small.py $a \
        > $O/sanitizer_$tool.log 2>&1
    el "$tool rc $?: $(tail -1 $O/sanitizer_$tool.log)"
done
for step in "$@"; do case $step in
ncu)
    timeout 150 ncu -k regex:bwd_main -c 1 --set full --import-source yes -o $B/rep128 $B/bh time1 128 8192 0 0 > $B/ncu.log 2>&1
    ncu -i $B/rep128.ncu-rep --print-details all > $O/ncu_d128_s8k.txt 2>&1
    ncu -i $B/rep128.ncu-rep --page source --csv --print-source sass > $O/ncu_d128_s8k_sass.csv 2>&1
    for s in 512 8192; do for c in 0 1; do
        echo "== d128 s$s causal $c"
        timeout 60 ncu -k regex:bwd_ -c 3 --metrics gpu__time_duration.sum $B/bh time1 128 $s $c 0 2>&1 | grep -E "bwd_|duration"
    done; done > $O/ncu_durations.txt
    el "ncu done"
    ;;
fwdbench)
    { $B/fh bench; $B/fh variants 128; } > $O/fwd_harness_bench.log 2>&1
    el "fwd harness bench / variants done"
    ;;
esac; done
el "done"
