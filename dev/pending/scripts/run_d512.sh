#!/bin/bash
# On the GPU machine, from main's root, after dev/pending/scripts/prep.sh here (ab/d512 = main + i36_d512.patch: head
# dims up to 512 on CUDA, fp32 / fp64 forward and backward (the simple kernels), fp16 / bf16 forward (fwd_sm80's d512
# config, two launches of 256 columns)). One call, ~8 min: build; test_headdim_v -k cuda; the fp32 / fp64 CUDA tests
# (the simple kernels at d <= 256 now run with 16 columns per lane) and the paged KV cache tests (dense paged d <= 128
# now on the HOOK d128 kernel); memcheck of d 512 calls; then bench_headdims.py (d512 beside d256, cuDNN / efficient /
# Flex). Land when the tests and memcheck are green; the bench row goes to benchmarks/results/h200/headdims_DATE.
cd ab/d512
export PYTHONPATH=$PWD
MAX_JOBS=16 python3 setup.py build_ext --inplace > $OUT/d512_build.log 2>&1 || { tail -30 $OUT/d512_build.log; exit 1; }
timeout 200 python3 -m pytest tests/test_headdim_v.py -q -n 12 -k cuda -p no:cacheprovider > $OUT/d512_headdim.log 2>&1
echo "test_headdim_v -k cuda rc $?: $(tail -1 $OUT/d512_headdim.log)"; grep -h "^FAILED" $OUT/d512_headdim.log | head
timeout 200 python3 -m pytest tests -q -n 12 -k "cuda and (fp32 or fp64 or float32 or float64 or kvcache or paged)" \
    -p no:cacheprovider > $OUT/d512_simple.log 2>&1
echo "pytest -k 'cuda and (fp32 / fp64 / kvcache / paged)' rc $?: $(tail -1 $OUT/d512_simple.log)"
grep -h "^FAILED" $OUT/d512_simple.log | head
cat > /tmp/d512_call.py <<'PY'
import torch, flashattn_ext
for dt, d, grad in ((torch.float64, 512, True), (torch.float32, 512, True), (torch.float64, 300, True),
                    (torch.bfloat16, 512, False), (torch.float16, 320, False)):
    q, k, v = (torch.randn(1, 150, 2, d, device="cuda", dtype=dt, requires_grad=grad) for _ in range(3))
    out = flashattn_ext.flash_attn_func(q, k, v, causal=True)
    if grad:
        out.sum().backward()
torch.cuda.synchronize()
print("ok")
PY
timeout 150 compute-sanitizer --tool memcheck python3 /tmp/d512_call.py > $OUT/d512_memcheck.log 2>&1
echo "memcheck d512 rc $?: $(tail -1 $OUT/d512_memcheck.log)"
timeout 120 python3 benchmarks/bench_headdims.py --out $OUT/headdims --time-budget 100 > $OUT/headdims.log 2>&1
echo "bench_headdims rc $?"; cat $OUT/headdims/*.md 2>/dev/null | head -30
