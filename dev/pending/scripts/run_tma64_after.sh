#!/bin/bash
# On the GPU machine, main after the D = 64 TMA landing: build, memcheck + racecheck of bwd_harness `small` on the sm90
# path (the TMA kernel among its dense d64 configs) and tests/test_sanitize.py under memcheck, then bench_gpu.py --quick
# --only bwd beside cuDNN / flash / efficient (~9 min).
B=${B:-/tmp/flashattn_dev}
bash dev/device.sh build ext harness > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
(timeout 170 compute-sanitizer --tool racecheck $B/bh small > $OUT/racecheck_bh.log 2>&1; echo "racecheck bh small rc $?: $(tail -1 $OUT/racecheck_bh.log)") &
timeout 120 compute-sanitizer --tool memcheck $B/bh small > $OUT/memcheck_bh.log 2>&1; echo "memcheck bh small rc $?: $(tail -1 $OUT/memcheck_bh.log)"
PYTHONPATH=$PWD timeout 150 compute-sanitizer --tool memcheck --print-limit 20 python3 tests/test_sanitize.py > $OUT/memcheck_py.log 2>&1
echo "memcheck test_sanitize rc $?: $(tail -1 $OUT/memcheck_py.log)"
wait
PYTHONPATH=$PWD timeout 200 python3 benchmarks/bench_gpu.py --out $OUT/bench --quick --only bwd --time-budget 170 > $OUT/bench.log 2>&1
echo "bench rc $?"; ls $OUT/bench; cat $OUT/bench/*.md 2>/dev/null | head -40
