#!/bin/bash
# bwd_d64_ab.sh: on the GPU machine, from the repo root (bash dev/bwd_d64_ab.sh): the one device call that decides
# launch.h's FLASH_BWD90_D64_RS (bwd_sm90.cu's dense d64 kernels in FlashAttention-3's order, P^T in registers for
# dV). dev/ab_sed.sh builds the tree as it is (base: the switch at 0, main's kernels), variant rs (the switch's
# default set to 1: lse / delta shuffled) and variant rs2 (2: lse / delta read per block from shared memory), and
# runs 2 rounds of bwd_harness time and timedet (the d64 rows; the d128 / d256 kernels are the same in all three:
# their ratios are the run's noise). Then on rs: bwd_harness test bf16 / fp16 (dense, varlen, deterministic configs
# compared bitwise over runs) and compute-sanitizer memcheck / racecheck of bwd_harness small; on rs2: test bf16.
# Logs under $OUT (default /tmp/d64_ab), 8 files.
set -o pipefail
export TMPDIR=/tmp
O=${OUT:-/tmp/d64_ab}
W=$TMPDIR/ab_sed
mkdir -p "$O"
S='s/^#define FLASH_BWD90_D64_RS 0$/#define FLASH_BWD90_D64_RS'
bash dev/ab_sed.sh 2 "bh time;bh timedet" rs="csrc/cuda/launch.h:$S 1/" rs2="csrc/cuda/launch.h:$S 2/" \
    >"$O/ab.log" 2>&1
echo "ab rc $?"; grep -E "FAIL|WARN|error" "$O/ab.log" | head
for v in rs rs2; do echo "== $v"; cat "$W/$v/bwd_sm90.log"; done >"$O/build_bwd_sm90.log" 2>&1
for v in rs rs2; do [ -x "$W/$v/bh" ] || { echo "$v: no harness built"; exit 1; }; done
python3 dev/ab_table.py "$O/ab.log" | tee "$O/ab_table.txt"
for dt in bf16 fp16; do
    timeout 150 "$W/rs/bh" test $dt >"$O/test_rs_$dt.log" 2>&1
    echo "rs test $dt rc $?: $(tail -1 "$O/test_rs_$dt.log")"
    grep -v "^PASS" "$O/test_rs_$dt.log" | head -8
done
for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool --print-limit 10 "$W/rs/bh" small >"$O/san_rs_$tool.log" 2>&1
    echo "rs $tool rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$O/san_rs_$tool.log" | tail -1)"
done
timeout 150 "$W/rs2/bh" test bf16 >"$O/test_rs2_bf16.log" 2>&1
echo "rs2 test bf16 rc $?: $(tail -1 "$O/test_rs2_bf16.log")"
grep -v "^PASS" "$O/test_rs2_bf16.log" | head -8
