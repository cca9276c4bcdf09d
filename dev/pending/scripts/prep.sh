#!/bin/bash
# Here (CPU machine), from the repo root: the patched trees under ab/ (untracked, travels to the GPU machine) that
# the run_*.sh scripts use. Then, on the GPU: `bash dev/pending/scripts/run_tma.sh` etc., one per call.
# ab/i34 = main + the four issue-34 instantiation patches (decode paged runtime v2, bwd80 dq hook runtime v2, bwd80
# main small tiles, rows runtime): 136 -> 105 __global__ instantiations.
set -e
rm -rf ab && mkdir -p ab/tma2 ab/pdl ab/hilo2 ab/i34
for t in tma2:i35_bwd_tma_loads pdl:i35_bwd_pdl hilo2:i33_dropout_hi_lo; do
    git archive HEAD | tar -x -C ab/${t%%:*}
    git apply --directory=ab/${t%%:*} dev/pending/${t#*:}.patch
done
git archive HEAD | tar -x -C ab/i34
for p in i34_decode_paged_runtime i34_bwd80_dq_hook_runtime i34_bwd80_main_small_tiles i34_rows_runtime; do
    git apply --directory=ab/i34 dev/pending/$p.patch
done
