#!/bin/bash
# One device call for the branch combo (main + i36-dv + i33-kvappend + i35-dqfirst + cpu-decode + i34-inst):
# the extension built beside dev/ab_sed.sh's A/B of bwd_sm90.cu (tree vs $REF: bh time, timedet, 2 rounds),
# then bh test bf16 and racecheck / memcheck of bh small (the new dQ / dK order), pytest -k cuda, the Python
# sanitizers over tests/test_sanitize.py, and the gradient-penalty bench, each under a timeout.
# Run from the repo root with main's bwd_sm90.cu copied to a carried path:
#   git show main:csrc/cuda/bwd_sm90.cu > .ab/main_bwd_sm90.cu; bash dev/combo_validate.sh .ab/main_bwd_sm90.cu
set -u
REF=$1
O=$OUT; export TMPDIR=/tmp PYTHONPATH=$PWD PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
( FLASHATTN_EXT_CUDA_ARCHS=90a MAX_JOBS=10 python3 setup.py build_ext --inplace > /tmp/ext.log 2>&1; echo $? > /tmp/ext_rc ) &
timeout 260 bash dev/ab_sed.sh 2 "bh time;bh timedet" main='csrc/cuda/bwd_sm90.cu<$REF' > $O/ab.log 2>&1
el "ab rc $?"; grep -E "FAIL|WARN" $O/ab.log | head -5
python3 dev/ab_table.py $O/ab.log > $O/ab_table.txt; cat $O/ab_table.txt
wait; el "ext rc $(cat /tmp/ext_rc)"; [ "$(cat /tmp/ext_rc)" = 0 ] || tail -20 /tmp/ext.log
( timeout 60 /tmp/ab_sed/base/bh test bf16 > /tmp/bh_test.log 2>&1; echo "bh test bf16 rc $?: $(tail -1 /tmp/bh_test.log)"; grep -v "^PASS" /tmp/bh_test.log | head -5
  for tool in racecheck memcheck; do timeout 60 compute-sanitizer --tool $tool --print-limit 10 /tmp/ab_sed/base/bh small > /tmp/bh_$tool.log 2>&1
  echo "bh small $tool rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/bh_$tool.log | tail -1)"; done ) > $O/harness.log 2>&1
cat $O/harness.log; el "harness done"
timeout 230 python3 -m pytest tests -q -rf --maxfail=30 -n 16 -k cuda -p no:cacheprovider > $O/pytest.log 2>&1
el "pytest rc $?: $(tail -1 $O/pytest.log)"; grep -E "^FAILED|^ERROR" $O/pytest.log | head -30
for a in "" --det; do tool=memcheck; [ -n "$a" ] && tool=racecheck
    timeout 50 compute-sanitizer --tool $tool --print-limit 10 python3 tests/test_sanitize.py $a > /tmp/py_$tool.log 2>&1
    el "py $tool rc $?: $(tail -1 /tmp/py_$tool.log)"; done
tail -5 /tmp/py_memcheck.log /tmp/py_racecheck.log > $O/py_sanitizers.log
timeout 60 python3 benchmarks/bench_grad_penalty.py --no-cpu --seqlens 1024 2048 4096 8192 --out $O/gp > /tmp/gp.log 2>&1; el "grad penalty rc $?"; grep "^|" /tmp/gp.log | head -8
