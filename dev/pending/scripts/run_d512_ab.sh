#!/bin/bash
# On the GPU machine, from main's root (one call, ~6 min): the d512 landing (cd1797b) beside the main before it
# (1881d05, in ab/pre512: `mkdir -p ab/pre512 && git archive 1881d05 | tar -x -C ab/pre512` here) on the calls whose
# kernels it changed (paged_fp32_ab.py), 3 rounds in turn. Keep the landing when every row is within 1%; else the
# dense paged d128 config gets its instantiations back (two to find elsewhere) or the simple kernels their 8 columns
# per lane at d <= 256.
( cd ab/pre512 && MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/pre512_build.log 2>&1 ) &
MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/main_build.log 2>&1
wait
tail -1 $OUT/pre512_build.log; tail -1 $OUT/main_build.log
S=$PWD/dev/pending/scripts/paged_fp32_ab.py
for r in 1 2 3; do
    for t in main pre512; do
        d=$PWD; [ $t = pre512 ] && d=$PWD/ab/pre512
        (cd $d && PYTHONPATH=$d timeout 100 python3 $S > $OUT/${t}_$r.txt 2>&1) || echo "$t round $r failed: $(tail -2 $OUT/${t}_$r.txt)"
    done
done
python3 - <<'PY'
import os, statistics
out = os.environ["OUT"]
def load(t):
    rows = {}
    for r in (1, 2, 3):
        for line in open(f"{out}/{t}_{r}.txt"):
            *name, ms = line.split()
            try: rows.setdefault(" ".join(name), []).append(float(ms))
            except ValueError: pass
    return {k: statistics.median(v) for k, v in rows.items()}
a, b = load("main"), load("pre512")
for k in a:
    if k in b: print(f"{k}: main {a[k]:.4f} ms, before {b[k]:.4f} ms, speed main / before {b[k] / a[k]:.3f}")
PY
