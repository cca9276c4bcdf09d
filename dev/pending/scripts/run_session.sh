#!/bin/bash
# On the GPU machine, main as it is (one call, ~9 min): build; compute-sanitizer memcheck + racecheck of bwd_harness
# `small` on the sm90 path (the landed D = 64 TMA kernel among its dense d64 configs) and tests/test_sanitize.py under
# memcheck, beside them the kernel report (pytest tests/test_cuda.py -k last_cuda_kernels, python -m flashattn_ext);
# then bench_gpu.py --quick --only bwd beside cuDNN / flash / efficient.
B=${B:-/tmp/flashattn_dev}
bash dev/device.sh build ext harness > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
(timeout 170 compute-sanitizer --tool racecheck $B/bh small > $OUT/racecheck_bh.log 2>&1; echo "racecheck bh small rc $?: $(tail -1 $OUT/racecheck_bh.log)") &
(PYTHONPATH=$PWD timeout 150 python3 -m pytest tests/test_cuda.py -q -p no:cacheprovider -k last_cuda_kernels > $OUT/report_test.log 2>&1
 echo "pytest last_cuda_kernels rc $?: $(tail -1 $OUT/report_test.log)"
 PYTHONPATH=$PWD timeout 60 python3 -m flashattn_ext > $OUT/selfcheck.txt 2>&1; echo "python -m flashattn_ext rc $?") &
timeout 120 compute-sanitizer --tool memcheck $B/bh small > $OUT/memcheck_bh.log 2>&1; echo "memcheck bh small rc $?: $(tail -1 $OUT/memcheck_bh.log)"
PYTHONPATH=$PWD timeout 150 compute-sanitizer --tool memcheck --print-limit 20 python3 tests/test_sanitize.py > $OUT/memcheck_py.log 2>&1
echo "memcheck test_sanitize rc $?: $(tail -1 $OUT/memcheck_py.log)"
wait
cat $OUT/selfcheck.txt
PYTHONPATH=$PWD timeout 170 python3 benchmarks/bench_gpu.py --out $OUT/bench --quick --only bwd --time-budget 140 > $OUT/bench.log 2>&1
echo "bench rc $?"; ls $OUT/bench; cat $OUT/bench/*.md 2>/dev/null | head -40
