#!/bin/bash
# Device A/B of compile-time settings of csrc/cuda/bwd_sm90.cu for the deterministic backward, without torch:
# one bwd_harness per setting (a string of nvcc flags, e.g. -DBWD90_CAUSAL_ORDER=0; "" the tree as it is),
# each run with `timedet` (the default and deterministic mode of the same shapes, interleaved), then a table
# of det / default time per setting; then the deterministic configs of the harness's suite (`test all det`,
# bitwise over DET_RUNS runs) on each.
# Run from the repo root: bash dev/det_ab.sh "" "-DSOME_KNOB=1" ...
# (the first setting is the baseline; logs under $OUT, one file per kind: at most 8 files come back from the
# device). `timev`'s dropout rows (a HOOK kernel) are printed for the baseline; the suites run side by side at
# the end.
set -u
B=/tmp/det_ab; mkdir -p $B; O=${OUT:-$B}
F="-std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Icsrc -Icsrc/cuda -DFLASHATTN_EXT_SM90A"
t0=$(date +%s)
settings=("$@")
c() { local src=$1 name=$2; shift 2; nvcc $F "$@" -c $src -o $B/$name.o > $B/$name.log 2>&1 || { echo "FAIL $name"; tail -20 $B/$name.log; }; }
for f in launch fwd_sm80 fwd_decode fwd_simple bwd_sm80 bwd_simple fwd_sm90; do c csrc/cuda/$f.cu $f & done
c dev/bwd_harness.cu bwdh &
i=0; for s in "${settings[@]}"; do c csrc/cuda/bwd_sm90.cu bwd_sm90_$i $s & i=$((i + 1)); done
wait
CO="$B/launch.o $B/fwd_sm80.o $B/fwd_decode.o $B/fwd_simple.o $B/bwd_sm80.o $B/bwd_simple.o $B/fwd_sm90.o"
n=$i; for i in $(seq 0 $((n - 1))); do nvcc $F $B/bwdh.o $CO $B/bwd_sm90_$i.o -o $B/h$i & done; wait
echo "builds $(( $(date +%s) - t0 )) s"
for i in $(seq 0 $((n - 1))); do
    timeout 20 $B/h$i time1 128 2048 0 1 > /dev/null 2>&1 || { echo "h$i: deterministic smoke run failed or hung"; continue; }
    timeout 90 stdbuf -oL $B/h$i timedet > $B/timedet_h$i.log 2>&1
    if [ $i = 0 ]; then # timev's dropout rows (the HOOK kernels)
        timeout 60 stdbuf -oL $B/h$i timev > $B/timev_h$i.log 2>&1; echo "h$i timev:"; grep dropout $B/timev_h$i.log
    fi
done
python3 - $B $n "${settings[@]}" <<'PY'
import re, sys
o, n, settings = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print("det / default time:", " | ".join(f"h{i} = [{s}]" for i, s in enumerate(settings)))
rows = {}
for i in range(n):
    try: lines = open(f"{o}/timedet_h{i}.log").read().splitlines()
    except OSError: continue
    for l in lines:
        m = re.search(r"d= *(\d+) seqlen= *(\d+).*causal=(\d) det=(\d)\s*:\s*([0-9.]+) ms", l)
        if m:
            rows.setdefault(m.group(1, 2, 3), {}).setdefault(i, {})[m.group(4)] = float(m.group(5))
for (d, s, causal), per in rows.items():
    cells = [f"{per[i]['1'] / per[i]['0']:.2f} ({per[i]['1']:.3f} ms)" if i in per and len(per[i]) == 2 else "-" for i in range(n)]
    print(f"d={d:>3} s={s:>4} causal={causal}: " + "  ".join(cells))
PY
for i in $(seq 0 $((n - 1))); do # the suites side by side (untimed)
    ( timeout 240 $B/h$i test all det > $B/test_det_h$i.log 2>&1; echo "h$i test all det rc $?: $(tail -1 $B/test_det_h$i.log)" ) &
done; wait
for k in timedet timev test_det; do for f in $B/${k}_h*.log; do echo "== $f"; cat $f; done > $O/$k.log 2>/dev/null; done
echo "done $(( $(date +%s) - t0 )) s"
