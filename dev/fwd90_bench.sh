#!/usr/bin/env bash
# fwd90_bench.sh: on the GPU machine, from the repo root: build the forward harness once per variant of the
# Hopper forward (fwd_sm90.cu's FWD90_* knobs), run the correctness checks on the first variant, then the
# bf16 benchmark of each variant beside the mma.sync forward (FLASHATTN_EXT_DISABLE_SM90=1).
#   bash dev/fwd90_bench.sh [NAME=MACRO=VALUE[,MACRO=VALUE...] ...]      (default: base=)
#   e.g. bash dev/fwd90_bench.sh base= nopp=FWD90_PINGPONG=0 s3=FWD90_STAGES_D128=3
# Env: CHECK=0 skips the checks; BENCH_D limits the benchmark to one head dim; SM80=0 skips the sm80 row.
set -uo pipefail
FLAGS="-std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -DFLASHATTN_EXT_SM90A -Icsrc -Icsrc/cuda"
COMMON="csrc/cuda/launch.cu csrc/cuda/fwd_sm80.cu csrc/cuda/fwd_decode.cu csrc/cuda/fwd_simple.cu
        csrc/cuda/bwd_sm80.cu csrc/cuda/bwd_sm90.cu csrc/cuda/bwd_simple.cu dev/fwd_harness.cu"
BIN=${TMPDIR:-/tmp}/fwd90_bench
mkdir -p "$BIN"
OBJS=""
for f in $COMMON; do
    o="$BIN/$(basename "$f" .cu).o"
    OBJS="$OBJS $o"
    nvcc $FLAGS -c "$f" -o "$o" >"$o.log" 2>&1 || { echo "build $f failed"; grep -m5 error "$o.log"; } &
done
variants=${*:-base=}
for v in $variants; do
    name=${v%%=*}
    defs=""
    spec=${v#*=}
    [ -n "$spec" ] && for kv in ${spec//,/ }; do defs="$defs -D$kv"; done
    nvcc $FLAGS -Xptxas -v $defs -c csrc/cuda/fwd_sm90.cu -o "$BIN/fwd90_$name.o" >"$BIN/fwd90_$name.log" 2>&1 \
        || { echo "build $name failed"; grep -m5 error "$BIN/fwd90_$name.log"; } &
done
wait
first=""
for v in $variants; do
    name=${v%%=*}
    nvcc $FLAGS $OBJS "$BIN/fwd90_$name.o" -o "$BIN/h_$name" || continue
    echo "== $v: registers / spills"
    grep -E "registers|spill" "$BIN/fwd90_$name.log" | sort | uniq -c
    [ -z "$first" ] && first=$name
done
[ -z "$first" ] && exit 1
if [ "${CHECK:-1}" != 0 ]; then
    echo "== check ($first)"
    timeout 180 "$BIN/h_$first" check >"$BIN/check.log" 2>&1 && echo "check passed" || echo "CHECK FAILED"
    grep -E "FAIL|passed|failed" "$BIN/check.log" | tail -15
fi
[ "${SM80:-1}" != 0 ] && echo "== sm80 forward (FLASHATTN_EXT_DISABLE_SM90=1)" &&
FLASHATTN_EXT_DISABLE_SM90=1 timeout 120 "$BIN/h_$first" bench ${BENCH_D:-}
for v in $variants; do
    name=${v%%=*}
    [ -x "$BIN/h_$name" ] || continue
    echo "== sm90 forward: $v"
    timeout 120 "$BIN/h_$name" bench ${BENCH_D:-} || echo "BENCH FAILED (rc $?)"
done
