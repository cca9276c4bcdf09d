"""Small forward + backward calls through the extension on CUDA, for compute-sanitizer
(memcheck, racecheck): every dtype path, tails, causal both alignments, GQA, rows with no key,
a padded head dim and deterministic mode. Exits non-zero on NaN or a mismatch with the reference."""
import torch

import flashattn_ext
from flashattn_ext.reference import attention_ref

CONFIGS = [
    # (dtype, batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, causal, deterministic)
    (torch.bfloat16, 1, 77, 130, 4, 2, 64, True, False),
    (torch.float16, 2, 130, 61, 2, 1, 128, True, True),
    (torch.bfloat16, 1, 65, 65, 2, 2, 256, False, False),
    (torch.float16, 1, 33, 47, 2, 2, 40, False, False),
    (torch.float32, 1, 19, 23, 2, 1, 24, True, False),
    (torch.float64, 1, 23, 19, 2, 2, 8, True, False),
]
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-5, torch.float64: 1e-12}


def rel_err(x, ref):
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def main():
    torch.manual_seed(0)
    failures = 0
    for dtype, b, sq, sk, h, hkv, d, causal, det in CONFIGS:
        q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, requires_grad=True)
        k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, requires_grad=True)
        v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, requires_grad=True)
        out = flashattn_ext.flash_attn_func(q, k, v, causal=causal, deterministic=det)
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        ref = attention_ref(q64, k64, v64, causal=causal)[0]
        ref_grads = torch.autograd.grad(ref, (q64, k64, v64), dout.double())
        errs = [rel_err(out, ref)] + [rel_err(g, r) for g, r in zip(grads, ref_grads)]
        ok = all(e <= TOLERANCE[dtype] for e in errs) and not any(t.isnan().any() for t in (out, *grads))
        failures += not ok
        print(f"{str(dtype):15s} b{b} sq{sq} sk{sk} h{h}/{hkv} d{d} causal={causal} det={det}: "
              f"rel err out/dq/dk/dv {' '.join(f'{e:.1e}' for e in errs)} {'ok' if ok else 'FAIL'}")
    torch.cuda.synchronize()
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
