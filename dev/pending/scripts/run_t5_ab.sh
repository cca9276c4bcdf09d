#!/bin/bash
# On the GPU machine, from main's root, after dev/pending/scripts/prep.sh here (ab/t5 = main + i34_t5_half.patch):
# both trees built (extension in place), bench_variants.py (ALiBi, T5, softcap) on each, one process each, 2 rounds
# interleaved; then test_rel_bias -k cuda on ab/t5 on the sm90 path and the sm80 path (~9 min).
# Land when the ALiBi / softcap rows are within 1% of main's and T5 within 10% of ALiBi; then run_t5.sh suite.
( cd ab/t5 && MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/t5_build.log 2>&1 ) &
MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/main_build.log 2>&1
wait
tail -1 $OUT/t5_build.log; tail -1 $OUT/main_build.log
for r in 1 2; do
  for t in t5 main; do
    d=$PWD; [ $t = t5 ] && d=$PWD/ab/t5
    (cd $d && PYTHONPATH=$d timeout 120 python3 benchmarks/bench_variants.py --out $OUT/${t}_$r --variants alibi t5 softcap > $OUT/${t}_$r.log 2>&1)
    echo "$t round $r"; grep -E "^\| (ALiBi|T5|softcap)" $OUT/${t}_$r/variants.md | head -12
  done
done
cd ab/t5
PYTHONPATH=$PWD timeout 150 python3 -m pytest tests/test_rel_bias.py -q -x -k cuda -p no:cacheprovider 2>&1 | tail -2
FLASHATTN_EXT_DISABLE_SM90=1 PYTHONPATH=$PWD timeout 120 python3 -m pytest tests/test_rel_bias.py -q -x -k cuda -p no:cacheprovider 2>&1 | tail -2
