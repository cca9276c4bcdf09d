#!/bin/bash
# On the GPU machine, from main's root, after prep.sh here (ab/sm86 = main + i36_sm86_fwd.patch: the d256 fwd_sm80
# kernels' second body of 64 x 32 tiles for 99 KB of shared memory). One call, ~9 min:
# both trees built; correctness on ab/sm86: fwd_harness check through fwd_sm80 (FLASHATTN_EXT_DISABLE_SM90=1) with the
# sm86 limit (FLASHATTN_EXT_SMEM_LIMIT=101376: every forward case at d 129-256 on the small body) and without (the big
# body), pytest test_cuda -k shared_memory, memcheck of the d256 small-body calls; speed: sm86_fwd_ab.py in both trees
# on the sm80 path, 2 rounds in turn, and on ab/sm86 with the sm86 limit (the small tiles' TFLOP/s).
# Land when the checks pass and every main-vs-patch row is within 1%.
( cd ab/sm86 && MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/sm86_build.log 2>&1 ) &
MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/main_build.log 2>&1
wait
tail -1 $OUT/sm86_build.log; tail -1 $OUT/main_build.log
cd ab/sm86
export PYTHONPATH=$PWD
B=/tmp/sm86_dev bash dev/device.sh build harness > $OUT/sm86_harness_build.log 2>&1
for lim in 101376 ""; do
    FLASHATTN_EXT_DISABLE_SM90=1 FLASHATTN_EXT_SMEM_LIMIT=$lim timeout 200 /tmp/sm86_dev/fh check > $OUT/fh_check_$lim.log 2>&1
    echo "fh check (sm80 path, smem limit '${lim}') rc $?: $(tail -1 $OUT/fh_check_$lim.log)"
    grep -E "FAIL" $OUT/fh_check_$lim.log | head -5
done
timeout 150 python3 -m pytest tests/test_cuda.py -q -p no:cacheprovider -k shared_memory 2>&1 | tail -2
cat > /tmp/sm86_call.py <<'PY'
import torch, flashattn_ext
for kw in ({}, {"causal": True, "softcap": 20.0}, {"dropout_p": 0.2}):
    q, k, v = (torch.randn(2, 200, 2, 256, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flashattn_ext.flash_attn_func(q, k, v, **kw)
torch.cuda.synchronize()
print("ok")
PY
FLASHATTN_EXT_DISABLE_SM90=1 FLASHATTN_EXT_SMEM_LIMIT=101376 timeout 120 compute-sanitizer --tool memcheck python3 /tmp/sm86_call.py > $OUT/sm86_memcheck.log 2>&1
echo "memcheck rc $?: $(tail -1 $OUT/sm86_memcheck.log)"
cd ../..
S=$PWD/dev/pending/scripts/sm86_fwd_ab.py
for r in 1 2; do
    for t in sm86 main; do
        d=$PWD; [ $t = sm86 ] && d=$PWD/ab/sm86
        (cd $d && FLASHATTN_EXT_DISABLE_SM90=1 PYTHONPATH=$d timeout 100 python3 $S > $OUT/${t}_$r.txt 2>&1) || echo "$t $r failed"
    done
done
(cd ab/sm86 && FLASHATTN_EXT_DISABLE_SM90=1 FLASHATTN_EXT_SMEM_LIMIT=101376 PYTHONPATH=$PWD timeout 100 python3 $S > $OUT/sm86_small.txt 2>&1)
python3 - <<'PY'
import os, statistics
out = os.environ["OUT"]
def load(names):
    rows = {}
    for n in names:
        for line in open(f"{out}/{n}.txt"):
            *k, ms = line.split()
            try: rows.setdefault(" ".join(k), []).append(float(ms))
            except ValueError: pass
    return {k: statistics.median(v) for k, v in rows.items()}
a, b, s = load(["sm86_1", "sm86_2"]), load(["main_1", "main_2"]), load(["sm86_small"])
for k in b:
    if k in a: print(f"{k}: main {b[k]:.4f} ms, patch {a[k]:.4f} ms, speed patch / main {b[k] / a[k]:.3f}; small tiles {s.get(k, float('nan')):.4f} ms")
PY
