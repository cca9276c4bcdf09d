#!/bin/bash
# On the GPU machine, from main's root, after dev/pending/scripts/prep.sh here (ab/t5 = main + i34_t5_half.patch,
# seventh version: bwd_sm90's HOOK kernels with a second body for T5's table, fwd_sm90 main's (T5's forward on the
# sm80 kernels), the sm80 HOOK kernels and fwd_decode's kernels carrying the table). One call each:
#   bash dev/pending/scripts/run_t5_v7.sh ab90     both trees built (once per machine), then bench_variants.py (alibi,
#                                                  softcap, padding, dropout, t5), ab/t5 and main in turn (~9 min)
#   bash dev/pending/scripts/run_t5_v7.sh ab80     the same on the sm80 path (FLASHATTN_EXT_DISABLE_SM90=1)
#   bash dev/pending/scripts/run_t5_v7.sh decode   bench_decode.py on both trees (the decode kernels changed)
# then run_t5.sh suite / sanitize. Land when every row but T5 is within 1% of main (repeat `ab` if one is not) and
# the suite and sanitizers pass; T5's speed against ALiBi is then a number for the note (issue 34 asks 10%).
set -u
build() {
    [ -f ab/t5/.built ] && [ -f .built_main ] && return
    ( cd ab/t5 && MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/t5_build.log 2>&1 && touch .built ) &
    MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/main_build.log 2>&1 && touch .built_main
    wait
    tail -1 $OUT/t5_build.log; tail -1 $OUT/main_build.log
}
tree_dir() { [ $1 = t5 ] && echo $PWD/ab/t5 || echo $PWD; }
build
case ${1:-} in
ab80 | ab90)
    # ab80: the sm80 path (FLASHATTN_EXT_DISABLE_SM90=1: every HOOK kernel changed there); ab90: the default path
    # (bwd_sm90's HOOK kernels now with a second body, fwd_sm90 main's)
    env=""; [ $1 = ab80 ] && env="FLASHATTN_EXT_DISABLE_SM90=1"
    for t in t5 main; do
        d=$(tree_dir $t)
        (cd $d && env $env PYTHONPATH=$d timeout 200 python3 benchmarks/bench_variants.py --out $OUT/${t}_$1 \
            --variants alibi softcap padding dropout t5 --time-budget 170 > $OUT/${t}_$1.log 2>&1)
        echo "$t $1 rc $?"
    done
    python3 dev/pending/scripts/cmp_variants.py $OUT/t5_$1 $OUT/main_$1
    grep -E "^\| (ALiBi|T5)" $OUT/t5_$1/variants.md | head -4 ;;
decode)
    for t in t5 main; do
        d=$(tree_dir $t)
        (cd $d && PYTHONPATH=$d timeout 200 python3 benchmarks/bench_decode.py --out $OUT/${t}_decode > $OUT/${t}_decode.log 2>&1)
        echo "$t decode rc $?"
    done ;;
*) echo "usage: run_t5_v7.sh ab80|ab90|decode"; exit 2 ;;
esac
