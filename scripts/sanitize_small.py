"""Small forward + backward calls through the extension on CUDA, for compute-sanitizer
(memcheck, racecheck): every dtype path, tails, causal both alignments, GQA, rows with no key,
a padded head dim, deterministic mode, and every attention variant (window, softcap, ALiBi, sink,
bool and additive masks with broadcast dimensions and a mask gradient, dropout). Exits non-zero on
NaN or a mismatch with the float64 reference."""
import torch

import flashattn_ext
from flashattn_ext.reference import attention_ref

CONFIGS = [
    # (dtype, batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, causal, deterministic, variants)
    (torch.bfloat16, 1, 77, 130, 4, 2, 64, True, False, {}),
    (torch.float16, 2, 130, 61, 2, 1, 128, True, True, {}),
    (torch.bfloat16, 1, 65, 65, 2, 2, 256, False, False, {}),
    (torch.float16, 1, 33, 47, 2, 2, 40, False, False, {}),
    (torch.float32, 1, 19, 23, 2, 1, 24, True, False, {}),
    (torch.float64, 1, 23, 19, 2, 2, 8, True, False, {}),
    (torch.bfloat16, 1, 150, 200, 4, 2, 64, True, False, {"window_size": (37, 0), "softcap": 8.0}),
    (torch.float16, 1, 130, 97, 2, 2, 128, False, False, {"window_size": (20, 9), "alibi": True}),
    (torch.bfloat16, 2, 70, 140, 2, 1, 256, False, True, {"sink": True, "window_size": (50, -1)}),
    (torch.float16, 2, 90, 111, 4, 2, 64, False, False, {"mask": "bool"}),
    (torch.bfloat16, 1, 129, 66, 2, 2, 128, False, False, {"mask": "add_grad", "softcap": 20.0}),
    (torch.float16, 1, 100, 100, 2, 2, 64, True, False, {"dropout_p": 0.2}),
    (torch.bfloat16, 1, 80, 90, 2, 1, 256, False, False, {"dropout_p": 0.1, "mask": "bool"}),
    (torch.float32, 1, 31, 45, 2, 1, 24, True, False, {"window_size": (5, 0), "softcap": 5.0, "alibi": True,
                                                       "sink": True, "mask": "add_grad", "dropout_p": 0.3}),
    (torch.float64, 1, 29, 17, 2, 2, 8, False, False, {"window_size": (3, 4), "mask": "bool", "dropout_p": 0.25}),
]
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-5, torch.float64: 1e-12}


def rel_err(x, ref):
    return ((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def variant_args(var, b, sq, sk, h, dtype):
    """Keyword arguments of flash_attn_func and of attention_ref for one config's variants."""
    kw = {k: var[k] for k in ("window_size", "softcap", "dropout_p") if k in var}
    if var.get("alibi"):
        kw["alibi_slopes"] = torch.rand(b, h, device="cuda") * 0.3
    if var.get("sink"):
        kw["sink"] = torch.randn(h, device="cuda", requires_grad=True)
    if var.get("mask") == "bool":
        kw["attn_mask"] = torch.rand(b, 1, sq, sk, device="cuda") > 0.3      # broadcast over heads
    elif var.get("mask") == "add_grad":
        kw["attn_mask"] = torch.randn(1, h, sq, sk, device="cuda", dtype=dtype, requires_grad=True)
    return kw


def main():
    torch.manual_seed(0)
    failures = 0
    for dtype, b, sq, sk, h, hkv, d, causal, det, var in CONFIGS:
        q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, requires_grad=True)
        k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, requires_grad=True)
        v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, requires_grad=True)
        kw = variant_args(var, b, sq, sk, h, dtype)
        extra = [t for name in ("sink", "attn_mask") if (t := kw.get(name)) is not None and t.requires_grad]
        out, _, s_dmask = flashattn_ext.flash_attn_func(q, k, v, causal=causal, deterministic=det,
                                                        return_attn_probs=True, **kw)
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v, *extra), dout)
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        ref_kw = dict(kw)
        for name in ("sink", "attn_mask"):
            t = ref_kw.get(name)
            if t is not None and t.is_floating_point():
                ref_kw[name] = t.detach().double().requires_grad_(t.requires_grad)
        if "dropout_p" in ref_kw:
            ref_kw["dropout_mask"] = s_dmask >= 0
        extra64 = [ref_kw[name] for name in ("sink", "attn_mask") if name in ref_kw and ref_kw[name].requires_grad]
        ref = attention_ref(q64, k64, v64, causal=causal, **ref_kw)[0]
        ref_grads = torch.autograd.grad(ref, (q64, k64, v64, *extra64), dout.double())
        errs = [rel_err(out, ref)] + [rel_err(g, r) for g, r in zip(grads, ref_grads)]
        ok = all(e <= TOLERANCE[dtype] for e in errs) and not any(t.isnan().any() for t in (out, *grads))
        failures += not ok
        print(f"{str(dtype):15s} b{b} sq{sq} sk{sk} h{h}/{hkv} d{d} causal={causal} det={det} {var}: "
              f"rel err out/grads {' '.join(f'{e:.1e}' for e in errs)} {'ok' if ok else 'FAIL'}")
    torch.cuda.synchronize()
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
