#!/bin/bash
# T5 branch (this tree) beside main (ab/main, `git archive main`): both built, bench_variants alibi + t5 on each
# (one process each, interleaved twice), test_rel_bias -k cuda on this tree.
export PYTHONPATH=$PWD
( cd ab/main && MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/main_build.log 2>&1 ) &
MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/t5_build.log 2>&1
wait
for r in 1 2; do
  for t in t5 main; do
    d=$PWD; [ $t = main ] && d=$PWD/ab/main
    (cd $d && PYTHONPATH=$d timeout 120 python3 benchmarks/bench_variants.py --out $OUT/${t}_$r --variants alibi t5 softcap > $OUT/${t}_$r.log 2>&1)
    echo "$t round $r"; grep -E "^\| (ALiBi causal|T5 causal|softcap|dense) " $OUT/${t}_$r/variants.md | head -8
  done
done
timeout 120 python3 -m pytest tests/test_rel_bias.py -q -x -k cuda -p no:cacheprovider 2>&1 | tail -2
