#!/bin/bash
# Here (CPU machine), from the repo root: the patched trees under ab/ (untracked, travels to the GPU machine) that
# run_tma.sh, run_pdl.sh and run_hilo.sh use. Then, on the GPU: `bash dev/pending/scripts/run_tma.sh` etc., one per call.
set -e
rm -rf ab && mkdir -p ab/tma2 ab/pdl ab/hilo2
for t in tma2:i35_bwd_tma_loads pdl:i35_bwd_pdl hilo2:i33_dropout_hi_lo; do
    git archive HEAD | tar -x -C ab/${t%%:*}
    git apply --directory=ab/${t%%:*} dev/pending/${t#*:}.patch
done
