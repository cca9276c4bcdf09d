#!/bin/bash
# Here (CPU machine), from the repo root: the patched trees under ab/ (untracked, travels to the GPU machine) that
# the run_*.sh scripts use. Then, on the GPU: `bash dev/pending/scripts/run_split2.sh` etc., one per call.
# Trees by `patch -p1` inside a `git archive HEAD` copy, each checked to differ from main (a `git apply --include`
# with --directory once applied nothing and an A/B measured main against itself).
# ab/tma2 = main 5233855 (before the D = 64 TMA landing) + i35_bwd_tma_loads (run_tma.sh, run_tma_wg4.sh), ab/hilo2 = main + i33_dropout_hi_lo (run_hilo.sh), ab/pre512 = 1881d05 (run_q.sh d512), ab/sm86 = main + i36_sm86_fwd (run_q.sh sm86), ab/ndv = main + i36_native_dv (D512_TREE=ndv run_q.sh d512test, d512bench), ab/d256t = main + i35_d256_tma (BWD_AB=d256t BWD_ROWS=... run_q.sh bwdab), ab/p512 = main + i36_d512_fwd90 (FWD_AB=p512 run_q.sh fwdab, D512_TREE=p512 run_q.sh d512test d512san d512bench), ab/t5v14 = main + i34_t5_stack (branch t5-stack-h: i34_t5_half + v9..v14 as one change; run_q.sh t5v14abh, t5suite, t5san, t5ncu).
# `prep.sh TREE ...` makes only those trees (ab/ travels with every device call: keep it to the queue's).
set -e
rm -rf ab && mkdir ab
tree() { # name base patch...
    local n=$1 base=$2
    shift 2
    mkdir -p ab/$n && git archive $base | tar -x -C ab/$n
    for p in "$@"; do (cd ab/$n && patch -p1 -s --no-backup-if-mismatch <../../dev/pending/$p.patch); done
    if diff -rq csrc ab/$n/csrc >/dev/null; then echo "ab/$n equals main" >&2 && exit 1; fi
    if [ $base != HEAD ]; then echo "ab/$n is $base + its patch (the base of its A/B, not main)" >&2; fi
}
want_tree() { [ ${#ARGS[@]} -eq 0 ] || [[ " ${ARGS[*]} " == *" $1 "* ]]; }
ARGS=("$@")
want_tree tma2 && tree tma2 5233855 i35_bwd_tma_loads # the patch predates the D = 64 TMA landing
want_tree hilo2 && tree hilo2 HEAD i33_dropout_hi_lo
want_tree t5v14 && tree t5v14 HEAD i34_t5_stack
want_tree sm86 && tree sm86 HEAD i36_sm86_fwd
want_tree ndv && tree ndv HEAD i36_native_dv
want_tree p512 && tree p512 HEAD i36_d512_fwd90
want_tree d256t && tree d256t HEAD i35_d256_tma

if want_tree presimple; then mkdir -p ab/presimple && git archive 7a04002 | tar -x -C ab/presimple; fi # run_q.sh simpleab: main before the simple.cu merge
if want_tree pre512; then mkdir -p ab/pre512 && git archive 1881d05 | tar -x -C ab/pre512; fi # run_q.sh d512: main before the d512 landing
du -sh ab
