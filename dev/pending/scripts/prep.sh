#!/bin/bash
# Here (CPU machine), from the repo root: the patched trees under ab/ (untracked, travels to the GPU machine) that
# the run_*.sh scripts use. Then, on the GPU: `bash dev/pending/scripts/run_split2.sh` etc., one per call.
# Trees by `patch -p1` inside a `git archive HEAD` copy, each checked to differ from main (a `git apply --include`
# with --directory once applied nothing and an A/B measured main against itself).
# ab/i34 = main + the four issue-34 instantiation patches (decode paged runtime v2, bwd80 dq hook runtime v2, bwd80
# main small tiles, rows runtime): 136 -> 105 __global__ instantiations; ab/dec, ab/dq, ab/small, ab/rows: each alone.
set -e
rm -rf ab && mkdir ab
tree() { # name patch...
    local n=$1
    shift
    mkdir -p ab/$n && git archive HEAD | tar -x -C ab/$n
    for p in "$@"; do (cd ab/$n && patch -p1 -s <../../dev/pending/$p.patch); done
    if diff -rq csrc ab/$n/csrc >/dev/null; then echo "ab/$n equals main" >&2 && exit 1; fi
}
tree tma2 i35_bwd_tma_loads
tree pdl i35_bwd_pdl
tree hilo2 i33_dropout_hi_lo
tree dec i34_decode_paged_runtime
tree dq i34_bwd80_dq_hook_runtime
tree small i34_bwd80_main_small_tiles
tree rows i34_rows_runtime
tree i34 i34_decode_paged_runtime i34_bwd80_dq_hook_runtime i34_bwd80_main_small_tiles i34_rows_runtime
du -sh ab
