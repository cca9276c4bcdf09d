#!/bin/bash
# On the GPU machine, from main's root, after run_q.sh build made ab/$T5_TREE (default t5v14; same machine) or with `build` first:
#   bash dev/pending/scripts/run_t5.sh [build] suite   pytest tests -k cuda on that tree (every HOOK kernel changed)
#   bash dev/pending/scripts/run_t5.sh [build] sanitize compute-sanitizer memcheck / racecheck over test_sanitize.py
cd ab/${T5_TREE:-t5v14}
export PYTHONPATH=$PWD
if [ "${1:-}" = build ]; then
    shift
    MAX_JOBS=16 python3 setup.py build_ext --inplace > $OUT/t5_build.log 2>&1 || { tail -30 $OUT/t5_build.log; exit 1; }
fi
case ${1:-} in
suite)
    timeout 500 python3 -m pytest tests -q -n 12 -k cuda -p no:cacheprovider > $OUT/t5_suite.log 2>&1
    echo "suite rc $?: $(tail -1 $OUT/t5_suite.log)"; grep -h "^FAILED" $OUT/t5_suite.log | head -20 ;;
sanitize)
    timeout 280 compute-sanitizer --tool memcheck python3 tests/test_sanitize.py > $OUT/t5_memcheck.log 2>&1
    echo "memcheck rc $?: $(tail -1 $OUT/t5_memcheck.log)"
    timeout 280 compute-sanitizer --tool racecheck python3 tests/test_sanitize.py > $OUT/t5_racecheck.log 2>&1
    echo "racecheck rc $?: $(tail -1 $OUT/t5_racecheck.log)" ;;
*) echo "usage: run_t5.sh [build] suite|sanitize"; exit 2 ;;
esac
