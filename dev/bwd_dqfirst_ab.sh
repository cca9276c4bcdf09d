#!/bin/bash
# One device call deciding this branch's bwd_sm90 change (dQ issued before dK): dev/ab_sed.sh A/B of the tree
# (base) against main's bwd_sm90.cu (2 rounds of bwd_harness time, timedet and timev), then bwd_harness test
# bf16 / fp16 and compute-sanitizer memcheck / racecheck of bwd_harness small on the tree.
# Run from the repo root, with main's bwd_sm90.cu at .ab/main_bwd_sm90.cu: bash dev/bwd_dqfirst_ab.sh
set -o pipefail
export TMPDIR=/tmp
O=${OUT:-/tmp/dqfirst_ab}; mkdir -p $O
(bash dev/ab_sed.sh 2 "bh time;bh timedet;bh timev" main='csrc/cuda/bwd_sm90.cu<.ab/main_bwd_sm90.cu' > $O/ab.log 2>&1)
echo "ab rc $?"; grep -E "FAIL|WARN|error" $O/ab.log | head
python3 dev/ab_table.py $O/ab.log | tee $O/ab_table.txt
for dt in bf16 fp16; do
    timeout 150 /tmp/ab_sed/base/bh test $dt > $O/test_$dt.log 2>&1; echo "test $dt rc $?: $(tail -1 $O/test_$dt.log)"
    grep -v "^PASS" $O/test_$dt.log | head -8
done
for tool in memcheck racecheck; do
    timeout 100 compute-sanitizer --tool $tool --print-limit 10 /tmp/ab_sed/base/bh small > $O/san_$tool.log 2>&1
    echo "$tool rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/san_$tool.log | tail -1)"
done
