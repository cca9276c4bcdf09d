#!/usr/bin/env bash
# decode_bench.sh: on the GPU machine, from the repo root: build the forward harness once per decode-kernel
# variant (fwd_decode.cu's FWD_DECODE_* knobs) and run its decode-bench for each.
#   bash dev/decode_bench.sh [NAME=MACRO=VALUE[,MACRO=VALUE...] ...]
#   e.g. bash dev/decode_bench.sh base= r2=FWD_DECODE_MIN_ROUNDS=2 s4=FWD_DECODE_STAGES_D128=4
set -uo pipefail
FLAGS="-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DFLASHATTN_EXT_SM90A -Icsrc -Icsrc/cuda"
COMMON="csrc/cuda/launch.cu csrc/cuda/fwd_sm80.cu csrc/cuda/fwd_sm90.cu csrc/cuda/fwd_simple.cu csrc/cuda/bwd_sm80.cu csrc/cuda/bwd_sm90.cu
        csrc/cuda/bwd_simple.cu dev/fwd_harness.cu"
BIN=${TMPDIR:-/tmp}/decode_bench
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
    nvcc $FLAGS -Xptxas -v $defs -c csrc/cuda/fwd_decode.cu -o "$BIN/decode_$name.o" >"$BIN/decode_$name.log" 2>&1 \
        || { echo "build $name failed"; grep -m5 error "$BIN/decode_$name.log"; } &
done
wait
for v in $variants; do
    name=${v%%=*}
    nvcc $FLAGS $OBJS "$BIN/decode_$name.o" -o "$BIN/h_$name" || continue
    echo "== $v"
    "$BIN/h_$name" decode-bench
done
