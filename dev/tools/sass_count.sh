#!/bin/bash
# Static SASS counts of the Hopper backward kernels, on a machine without a GPU. It compiles
# csrc/cuda/bwd_sm90.cu (or the file given) for sm_90a and prints ptxas's wgmma serialization
# warnings (C7510-C7515) and spills. For each bf16 kernel it then counts the instructions of the
# largest loop, the per-tile main loop, and gives their mix. The count is static: every path in the
# loop counts, including a tail or masked copy that most tiles skip. The instruction count per tile is what
# the ncu profiles showed to be the limit (benchmarks/results/h200/bwd_sm90_2026-11-29b/progress.md).
# cuobjdump and nvdisasm come from PyPI (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm); they are
# installed once into dev/bin/sass.
# Usage, from the repo root: bash dev/tools/sass_count.sh [file.cu]
set -euo pipefail
SRC=${1:-csrc/cuda/bwd_sm90.cu}; T=dev/bin/sass; mkdir -p $T
if [ ! -x $T/nvidia/cu13/bin/cuobjdump ] || [ ! -x $T/nvidia/cu13/bin/nvdisasm ]; then
    python3 -m pip install -q --target $T nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
fi
export PATH=$PWD/$T/nvidia/cu13/bin:$PATH
nvcc -std=c++17 -O3 -arch=sm_90a -I$(dirname $SRC) -Icsrc -Icsrc/cuda -DFLASHATTN_EXT_SM90A -cubin $SRC -o $T/k.cubin \
    -Xptxas -v 2>&1 | grep -E "C751|spill stores" | sort | uniq -c || true
for f in $(cuobjdump -symbols $T/k.cubin | grep -o '_Z[0-9]*bwd_main_sm90[A-Za-z0-9_]*' | grep bfloat16 | sort -u); do
    cuobjdump -sass -fun "$f" $T/k.cubin | python3 -c '
import re, sys
from collections import Counter
ins = []
for line in sys.stdin:
    m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
    if m:
        ins.append((int(m.group(1), 16), m.group(2)))
best = None  # the largest conditional backward branch = the main loop (cold blocks jump back unconditionally)
for addr, text in ins:
    m = re.search(r"^@!?P\d+ BRA (0x[0-9a-f]+)", text)
    if m and int(m.group(1), 16) < addr and (best is None or addr - int(m.group(1), 16) > best[1] - best[0]):
        best = (int(m.group(1), 16), addr)
body = [t for a, t in ins if best and best[0] <= a <= best[1]]
mix = Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in body)
print(f"{sys.argv[1]}: main loop {len(body)} instructions")
print("  " + " ".join(f"{k}:{v}" for k, v in mix.most_common(16)))
' "$f"
done
