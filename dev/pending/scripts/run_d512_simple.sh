#!/bin/bash
# On the GPU machine, from main's root, after dev/pending/scripts/prep.sh here (ab/d512 = main + i36_simple_d512.patch:
# fp32 / fp64 on CUDA up to head dim 512): build; test_headdim_v on CUDA (d 257..512 fp32 / fp64, the limits' errors);
# every CUDA test of fp32 / fp64 (the simple kernels at d <= 256, now with 16 columns per lane); memcheck of a d 512
# fp64 forward + backward (its K / V tiles at 64 KB through the opt-in). ~7 min.
cd ab/d512
export PYTHONPATH=$PWD
MAX_JOBS=16 python3 setup.py build_ext --inplace > $OUT/d512_build.log 2>&1 || { tail -30 $OUT/d512_build.log; exit 1; }
timeout 200 python3 -m pytest tests/test_headdim_v.py -q -n 12 -k cuda -p no:cacheprovider > $OUT/d512_headdim.log 2>&1
echo "test_headdim_v -k cuda rc $?: $(tail -1 $OUT/d512_headdim.log)"; grep -h "^FAILED" $OUT/d512_headdim.log | head
timeout 240 python3 -m pytest tests -q -n 12 -k "cuda and (fp32 or fp64 or float32 or float64)" -p no:cacheprovider \
    > $OUT/d512_simple.log 2>&1
echo "pytest -k 'cuda and fp32/fp64' rc $?: $(tail -1 $OUT/d512_simple.log)"; grep -h "^FAILED" $OUT/d512_simple.log | head
cat > /tmp/d512_call.py <<'PY'
import torch, flashattn_ext
for dt, d in ((torch.float64, 512), (torch.float32, 512), (torch.float64, 300)):
    q, k, v = (torch.randn(1, 70, 2, d, device="cuda", dtype=dt, requires_grad=True) for _ in range(3))
    out = flashattn_ext.flash_attn_func(q, k, v, causal=True)
    out.sum().backward()
torch.cuda.synchronize()
print("ok")
PY
timeout 120 compute-sanitizer --tool memcheck python3 /tmp/d512_call.py > $OUT/d512_memcheck.log 2>&1
echo "memcheck d512 rc $?: $(tail -1 $OUT/d512_memcheck.log)"
