#!/usr/bin/env bash
# fwd_bench.sh: on the GPU machine, from the repo root: build the forward harness (default tile configs),
# run its correctness checks and its bf16 benchmark, then build and time alternative tile configs.
#   bash dev/fwd_bench.sh [VARIANT ...]
#   VARIANT: D64|D128|D256=head_dim,block_m,block_n,warps,q_in_regs,min_ctas_per_sm
#            e.g. D128=128,64,64,4,true,2   (see the FWD_CFG_* macros in csrc/cuda/fwd_sm80.cu)
set -uo pipefail
ARCH="-gencode=arch=compute_90a,code=sm_90a"
SRC="dev/fwd_harness.cu csrc/cuda/fwd_sm80.cu csrc/cuda/fwd_simple.cu"
BIN=${TMPDIR:-/tmp}/fwd_bench
mkdir -p "$BIN"

build() { # name, extra nvcc flags...
    local name=$1
    shift
    nvcc -std=c++17 -O3 $ARCH -Xptxas -v -Icsrc "$@" $SRC -o "$BIN/$name" >"$BIN/$name.log" 2>&1 ||
        { echo "build $name failed"; grep -m5 error "$BIN/$name.log"; }
}

build default &
i=0
for v in "$@"; do
    cfg=${v#*=}
    build "v$i" "-DFWD_CFG_${v%%=*}=${cfg//,/\\,}" &
    i=$((i + 1))
done
wait

echo "== registers / spills (default build, half kernels)"
grep -A2 "flash_fwd_sm80_kernel" "$BIN/default.log" | grep -E "registers|spill" | sort | uniq -c
"$BIN/default" check || echo "CHECK FAILED"
"$BIN/default" bench
i=0
for v in "$@"; do
    cfg=${v#*=}
    d=${cfg%%,*}
    echo "== variant $v: $(grep -A2 "bfloat16Li${d}E" "$BIN/v$i.log" | grep -E "registers|spill" | tr -s ' \n' ' ')"
    [ -x "$BIN/v$i" ] && "$BIN/v$i" bench "$d" | tail -n +3
    i=$((i + 1))
done
