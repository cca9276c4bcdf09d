#!/usr/bin/env bash
# fwd_variants.sh: on the GPU machine, from the repo root: build the forward harness (dev/fwd_harness.cu) once
# per variant of one forward kernel file and run harness modes on each.
#   bash dev/fwd_variants.sh KERNEL "MODES" [NAME=[PATCH] ...]      (default: base=)
#   KERNEL: a forward file of csrc/cuda without .cu (fwd_sm90, fwd_decode, fwd_sm80); NAME=PATCH: KERNEL.cu built
#   from a copy of csrc with PATCH applied (`git diff` output, e.g. other tiles in csrc/cuda/tiles.h; only KERNEL.cu
#   is rebuilt from the copy), NAME= the tree as it is; MODES: harness modes, each run on every variant, except
#   `check`, which runs on the first one (its log: $TMPDIR/fwd_variants/check.log)
#   e.g. bash dev/fwd_variants.sh fwd_sm90 "check bench" base= bn176=/tmp/bn176.patch
#        bash dev/fwd_variants.sh fwd_sm80 "check bench variants varlen-bench paged-bench"
# Env: MODE_ARG (one argument for every mode but check, e.g. a head dim for bench); SM80=1 first runs the modes
# with FLASHATTN_EXT_DISABLE_SM90=1 on the first variant (the mma.sync kernels, for comparison).
set -uo pipefail
kernel=$1 modes=$2
shift 2
FLAGS="-std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -DFLASHATTN_EXT_SM90A -Icsrc -Icsrc/cuda"
BIN=${TMPDIR:-/tmp}/fwd_variants
mkdir -p "$BIN"
OBJS=""
for f in csrc/cuda/launch.cu csrc/cuda/fwd_*.cu csrc/cuda/bwd_*.cu dev/fwd_harness.cu; do
    [ "$f" = "csrc/cuda/$kernel.cu" ] && continue
    o="$BIN/$(basename "$f" .cu).o"
    OBJS="$OBJS $o"
    nvcc $FLAGS -c "$f" -o "$o" >"$o.log" 2>&1 || { echo "build $f failed"; grep -m5 error "$o.log"; } &
done
variants=${*:-base=}
for v in $variants; do
    name=${v%%=*} patch=${v#*=} src=csrc
    if [ -n "$patch" ]; then
        src=$BIN/tree_$name/csrc
        rm -rf "$BIN/tree_$name" && mkdir -p "$BIN/tree_$name" && cp -r csrc "$src"
        patch -s -p1 -d "$BIN/tree_$name" <"$patch" || { echo "patch $patch failed"; continue; }
    fi
    nvcc $FLAGS -Xptxas -v -c "$src/cuda/$kernel.cu" -o "$BIN/k_$name.o" >"$BIN/k_$name.log" 2>&1 \
        || { echo "build $name failed"; grep -m5 error "$BIN/k_$name.log"; } &
done
wait
first=""
for v in $variants; do
    name=${v%%=*}
    nvcc $FLAGS $OBJS "$BIN/k_$name.o" -o "$BIN/h_$name" || continue
    echo "== $v: registers / spills"
    grep -E "registers|spill" "$BIN/k_$name.log" | sort | uniq -c
    [ -z "$first" ] && first=$name
done
[ -z "$first" ] && exit 1
for mode in $modes; do
    if [ "$mode" = check ]; then
        echo "== check ($first)"
        timeout 300 "$BIN/h_$first" check >"$BIN/check.log" 2>&1 && echo "check passed" || echo "CHECK FAILED"
        grep -E "FAIL|passed|failed" "$BIN/check.log" | tail -15
        continue
    fi
    if [ "${SM80:-0}" != 0 ]; then
        echo "== $mode, FLASHATTN_EXT_DISABLE_SM90=1 ($first)"
        FLASHATTN_EXT_DISABLE_SM90=1 timeout 120 "$BIN/h_$first" "$mode" ${MODE_ARG:-}
    fi
    for v in $variants; do
        name=${v%%=*}
        [ -x "$BIN/h_$name" ] || continue
        echo "== $mode: $v"
        timeout 120 "$BIN/h_$name" "$mode" ${MODE_ARG:-} || echo "$mode FAILED (rc $?)"
    done
done
