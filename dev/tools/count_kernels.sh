#!/bin/bash
# The __global__ instantiations of the CUDA build, per file and in all (the budget of issue 34: at most 120).
# It counts the host-side launch stubs that nvcc emits once per instantiated kernel (the __handle static of each
# __device_stub__), with nm, in the objects of the last setup.py build (build/temp.*/csrc/cuda/*.o, compiled with
# setup.py's flags), or in the folder given. -v also lists the kernels.
# Usage, from the repo root, after `python setup.py build_ext --inplace` (a CUDA build):
#   bash dev/tools/count_kernels.sh [-v] [objdir]
set -euo pipefail
VERBOSE=0
if [ "${1:-}" = -v ]; then VERBOSE=1; shift; fi
DIR=${1:-$(ls -d build/temp.*/csrc/cuda 2>/dev/null | head -1)}
if [ -z "$DIR" ] || ! ls "$DIR"/*.o >/dev/null 2>&1; then
    echo "no CUDA objects (build/temp.*/csrc/cuda/*.o): run a CUDA build first, or give the folder" >&2
    exit 1
fi
total=0
for o in "$DIR"/*.o; do
    kernels=$(nm -C "$o" | sed -n 's/^[0-9a-f]* b __device_stub__\(Z[^(]*\)(.*::__handle$/_\1/p' | sort -u | c++filt |
        sed 's/(anonymous namespace):://g')
    n=$(printf '%s' "$kernels" | grep -c . || true)
    printf '%-20s %4d\n' "$(basename "$o" .o).cu" "$n"
    if [ $VERBOSE = 1 ] && [ "$n" -gt 0 ]; then
        printf '%s\n' "$kernels" | sed 's/^/    /'
    fi
    total=$((total + n))
done
printf '%-20s %4d\n' total "$total"
