#!/usr/bin/env bash
# fwd_bench.sh: on the GPU machine, from the repo root: build the forward harness (default tile configs),
# run its correctness checks, its bf16 benchmark, its variant benchmark, its varlen benchmark and its paged
# KV-cache decode benchmark, then build and time alternative tile configs.
#   bash dev/fwd_bench.sh [VARIANT ...]
#   VARIANT: D64|D128|D256=head_dim,block_m,block_n,warps,q_in_regs,min_ctas_per_sm   (dense kernels)
#            H64|H128|H256=...                                     (HOOK kernels, block_n % 32 == 0)
#            P128=...                                 (the dense d <= 128 kernel with a paged KV cache)
#            e.g. D128=128,64,64,4,true,2  H128=128,128,64,4,false,1  P128=128,128,64,8,false,1
#            (see the FWD_CFG_* / FWD_HOOK_CFG_* / FWD_PAGED_CFG_D128 macros in csrc/cuda/fwd_sm80.cu)
set -uo pipefail
FLAGS="-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DFLASHATTN_EXT_SM90A -Icsrc -Icsrc/cuda"
# the harness calls launch.cu's flash_fwd_cuda, which links the backward: those files are built once
COMMON="csrc/cuda/launch.cu csrc/cuda/fwd_sm90.cu csrc/cuda/fwd_decode.cu csrc/cuda/fwd_simple.cu csrc/cuda/bwd_sm80.cu csrc/cuda/bwd_sm90.cu csrc/cuda/bwd_simple.cu"
BIN=${TMPDIR:-/tmp}/fwd_bench
mkdir -p "$BIN"

COMMON_OBJS=""
for f in $COMMON; do
    o="$BIN/$(basename "$f" .cu).o"
    COMMON_OBJS="$COMMON_OBJS $o"
    nvcc $FLAGS -c "$f" -o "$o" >"$o.log" 2>&1 || { echo "build $f failed"; grep -m5 error "$o.log"; } &
done
wait

build() { # name, extra nvcc flags... (the tile config macros reach fwd_sm80.cu only)
    local name=$1
    shift
    nvcc $FLAGS -Xptxas -v "$@" dev/fwd_harness.cu csrc/cuda/fwd_sm80.cu $COMMON_OBJS -o "$BIN/$name" \
        >"$BIN/$name.log" 2>&1 || { echo "build $name failed"; grep -m5 error "$BIN/$name.log"; }
}

macro() { # D128 -> FWD_CFG_D128, H128 -> FWD_HOOK_CFG_D128, P128 -> FWD_PAGED_CFG_D128
    case $1 in
    H*) echo "FWD_HOOK_CFG_D${1#H}" ;;
    P*) echo "FWD_PAGED_CFG_D${1#P}" ;;
    *) echo "FWD_CFG_$1" ;;
    esac
}

build default &
i=0
for v in "$@"; do
    cfg=${v#*=}
    build "v$i" "-D$(macro "${v%%=*}")=${cfg//,/\\,}" &
    i=$((i + 1))
done
wait

echo "== registers / spills (default build, half kernels; first Lb0 dense, Lb1 HOOK; last Lb1 paged KV)"
grep -A2 "flash_fwd_sm80_kernel" "$BIN/default.log" | grep -E "Compiling|registers|spill" |
    sed -E 's/.*kernelI(.*)EEv12.*/\1/' | paste - - - | sort | uniq -c
"$BIN/default" check || echo "CHECK FAILED"
"$BIN/default" bench
"$BIN/default" variants
"$BIN/default" varlen-bench
"$BIN/default" paged-bench
i=0
for v in "$@"; do
    cfg=${v#*=}
    d=${cfg%%,*}
    hook=$([ "${v:0:1}" = H ] && echo 1 || echo 0)
    paged=$([ "${v:0:1}" = P ] && echo 1 || echo 0)
    echo "== variant $v: $(grep -A2 "bfloat16Lb${hook}ELi${d}E.*Lb${paged}EE" "$BIN/v$i.log" | grep -E "registers|spill" | tr -s ' \n' ' ')"
    if [ -x "$BIN/v$i" ]; then
        if [ "$paged" = 1 ]; then
            "$BIN/v$i" paged-bench | tail -n +3
        elif [ "$hook" = 1 ]; then
            "$BIN/v$i" variants "$d" | tail -n +3
        else
            "$BIN/v$i" bench "$d" | tail -n +3
        fi
    fi
    i=$((i + 1))
done
