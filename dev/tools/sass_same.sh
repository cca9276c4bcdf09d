#!/bin/bash
# Per-kernel SASS identity of two trees, on a machine without a GPU: the proof that a layout move (code moved
# between files, kernels unchanged) leaves every kernel's machine code as it was (issue 34).
#   build SRC_ROOT OUT  compiles SRC_ROOT/csrc/cuda/*.cu, one object each, into OUT with setup.py's nvcc flags,
#                       its default archs (80+PTX;90a) and the flags torch's CUDAExtension adds; $JOBS (default 2)
#                       nvcc at a time; FILES="a.cu b.cu" compiles only those.
#   cmp OLD NEW         python3 dev/tools/sass_diff.py --pooled OLD NEW: the objects of each folder pooled (a kernel
#                       may change file), every function's SASS (both encoding words of every instruction) and
#                       resource usage compared by (arch, mangled name), and the sets of __global__
#                       instantiations; one summary line, exit status 1 on any difference.
# cuobjdump: $CUOBJDUMP, else the one on PATH. Usage, from the repo root:
#   git archive main csrc | tar -x -C /tmp/old && bash dev/tools/sass_same.sh build /tmp/old /tmp/old_obj
#   bash dev/tools/sass_same.sh build . /tmp/new_obj && bash dev/tools/sass_same.sh cmp /tmp/old_obj /tmp/new_obj
set -euo pipefail
NVCC_FLAGS="-D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__
 -D__CUDA_NO_HALF2_OPERATORS__ --expt-relaxed-constexpr -Xcompiler -fPIC -std=c++20 -O3 -lineinfo
 -gencode=arch=compute_80,code=[sm_80,compute_80] -gencode=arch=compute_90a,code=sm_90a -DFLASHATTN_EXT_SM90A"

case "${1:-}" in
    build)
        src=$2 out=$3
        mkdir -p "$out"
        files=${FILES:-$(cd "$src" && ls csrc/cuda/*.cu | xargs -n1 basename)}
        printf '%s\n' $files | xargs -P "${JOBS:-2}" -I{} sh -c \
            'nvcc '"$(echo $NVCC_FLAGS)"' -I"$1/csrc" -c "$1/csrc/cuda/$3" -o "$2/$(basename "$3" .cu).o"' _ "$src" "$out" {}
        ;;
    cmp) exec python3 "$(dirname "$0")/sass_diff.py" --pooled "$2" "$3" ;;
    *) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
