#!/bin/bash
# T5 rel_bias on the fp16 / bf16 tensor-core kernels (branch t5-half), on the GPU machine, from the repo root:
#   bash dev/pending/scripts/run_t5.sh check   build the extension, test_rel_bias -k cuda on the sm90 path and the sm80
#                                              path (FLASHATTN_EXT_DISABLE_SM90=1), bench_variants alibi + t5 (~8 min)
#   bash dev/pending/scripts/run_t5.sh suite   pytest tests -k cuda (every HOOK kernel changed: the table branch)
case ${1:-} in
check)
    bash dev/device.sh build ext > $OUT/t5_build.log 2>&1 || { tail -30 $OUT/t5_build.log; exit 1; }
    timeout 200 python3 -m pytest tests/test_rel_bias.py -q -x -k cuda -p no:cacheprovider > $OUT/t5_pytest90.log 2>&1
    echo "sm90 path rc $?: $(tail -1 $OUT/t5_pytest90.log)"
    FLASHATTN_EXT_DISABLE_SM90=1 timeout 150 python3 -m pytest tests/test_rel_bias.py -q -x -k "cuda" \
        -p no:cacheprovider > $OUT/t5_pytest80.log 2>&1
    echo "sm80 path rc $?: $(tail -1 $OUT/t5_pytest80.log)"
    grep -h -E "^FAILED|Error|assert" $OUT/t5_pytest*.log | head -20
    timeout 200 python3 benchmarks/bench_variants.py --out $OUT/t5_variants --variants dense alibi t5 > $OUT/t5_bench.log 2>&1
    echo "bench rc $?"; cat $OUT/t5_variants/*.md 2>/dev/null | head -40 ;;
suite)
    timeout 560 python3 -m pytest tests -q -n 12 -k cuda -p no:cacheprovider > $OUT/t5_suite.log 2>&1
    echo "suite rc $?: $(tail -1 $OUT/t5_suite.log)"; grep -h "^FAILED" $OUT/t5_suite.log | head -20 ;;
*) echo "usage: run_t5.sh check|suite"; exit 2 ;;
esac
