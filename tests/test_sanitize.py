"""Small forward + backward calls through the extension on CUDA, for compute-sanitizer
(memcheck, racecheck): every dtype path, tails, causal both alignments, GQA, rows with no key,
a padded head dim, head dims up to 512, deterministic mode, and every attention variant (window, softcap, ALiBi, sink,
bool and additive masks with broadcast dimensions and a mask gradient, dropout, T5's rel_bias in fp32 / fp64
with its gradient, rel_buckets contents out of range included); variable-length
batches (lengths 0 and 1, sq != sk, GQA, variants) against a float64 reference per sequence, and
deliberately bad cu_seqlens / seqused_k contents (past the tensors, negative, decreasing), which must
never reach outside q/k/v (memcheck) however wrong the result. Exits non-zero on NaN or a mismatch with
the float64 reference. `--det`: the deterministic configs alone (racecheck over all of them is slow); `--large`: those
with head dims above 256.
Run as a script under compute-sanitizer (dev/device.sh validate / sanitize: PYTHONPATH=. python3
tests/test_sanitize.py [--det]); as a test, the same calls against the reference without the sanitizer."""
import sys

import pytest
import torch

import flashattn_ext
from flashattn_ext import _core
from flashattn_ext._checks import t5_buckets
from flashattn_ext.reference import attention_ref

CONFIGS = [
    # (dtype, batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, causal, deterministic, variants)
    (torch.bfloat16, 1, 77, 130, 4, 2, 64, True, False, {}),
    (torch.float16, 2, 130, 61, 2, 1, 128, True, True, {}),
    (torch.bfloat16, 1, 200, 300, 2, 2, 64, False, True, {}),   # deterministic over 3 key tiles (Hopper: chained)
    (torch.float16, 1, 300, 280, 2, 1, 128, True, True, {"window_size": (100, 0)}),
    (torch.bfloat16, 1, 200, 270, 2, 1, 128, False, True, {"mask": "bool", "dropout_p": 0.1}),  # HOOK, chained
    (torch.float16, 1, 150, 260, 2, 2, 64, True, True, {"softcap": 10.0, "alibi": True}),
    (torch.bfloat16, 1, 140, 200, 2, 1, 256, True, True, {}),  # d256 ORDERED over 4 key tiles
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
    # additive masks with rows at finfo.min (Hugging Face's padding, issue 33: score.h "Huge additive entries",
    # the backward preprocess's scan of those rows): GQA d64, d256 (the tiled preprocess) deterministic, fp32, fp64
    (torch.bfloat16, 2, 100, 150, 4, 2, 64, False, False, {"mask": "add_finfo"}),
    (torch.bfloat16, 1, 70, 90, 2, 1, 256, False, True, {"mask": "add_finfo", "softcap": 5.0}),
    (torch.float32, 1, 31, 45, 2, 1, 24, False, False, {"mask": "add_finfo", "alibi": True}),
    (torch.float64, 2, 23, 19, 2, 2, 8, False, False, {"mask": "add_finfo"}),
    # head dims 257..512 (issue 36): bwd_sm80.cu's d512 config, two CTAs per key tile (GQA, tails, one Q / dO stage
    # over 3 query tiles; the mask gradient from one of the two), and the deterministic backward on the fp32 kernels
    (torch.bfloat16, 1, 70, 130, 4, 2, 512, True, False, {}),
    (torch.float16, 1, 100, 90, 2, 2, 320, False, False, {"mask": "add_grad", "softcap": 5.0, "dropout_p": 0.1}),
    (torch.bfloat16, 1, 50, 60, 2, 1, 384, False, True, {}),
]
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-5, torch.float64: 1e-12}


def rel_err(x, ref, floor=1e-30):
    """|x - ref| / |ref|, the reference's norm floored at floor (the varlen checks use 1: a sequence with
    one key has dq = dk = 0 exactly in the reference and rounding noise in ours)."""
    return ((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(floor)).item()


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
    elif var.get("mask") == "add_finfo":  # whole rows at finfo.min, and the last batch's last keys (padding)
        m = torch.randn(b, 1, sq, sk, device="cuda", dtype=dtype)
        m[:, :, : sq // 5] = torch.finfo(dtype).min
        m[-1, :, :, 2 * sk // 3:] = torch.finfo(dtype).min
        kw["attn_mask"] = m.requires_grad_()
    return kw


VARLEN_CONFIGS = [
    # (dtype, [(seqlen_q, seqlen_k) per sequence], nheads, nheads_kv, headdim, causal, variants)
    (torch.bfloat16, [(77, 130), (0, 5), (1, 1), (130, 61)], 4, 2, 64, True, {}),
    (torch.float16, [(65, 65), (3, 0), (129, 200)], 2, 2, 128, False, {"window_size": (20, 9), "softcap": 8.0}),
    (torch.bfloat16, [(40, 90), (90, 40)], 2, 1, 256, True, {"alibi": True, "sink": True}),
    (torch.bfloat16, [(40, 90), (90, 40)], 2, 1, 512, True, {"alibi": True}),
    (torch.float32, [(19, 23), (0, 0), (7, 30)], 2, 1, 24, True, {"window_size": (5, 0)}),
    (torch.float64, [(23, 19), (5, 1)], 2, 2, 8, False, {"dropout_p": 0.0, "softcap": 3.0}),
]


def cumulative(lengths):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device="cuda")


def check_varlen(dtype, lens, h, hkv, d, causal, var):
    """One varlen forward + backward against attention_ref per sequence; returns True when it matches."""
    lq, lk = [a for a, _ in lens], [b for _, b in lens]
    cu_q, cu_k = cumulative(lq), cumulative(lk)
    q = torch.randn(sum(lq), h, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(sum(lk), hkv, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(sum(lk), hkv, d, device="cuda", dtype=dtype, requires_grad=True)
    kw = variant_args(var, len(lens), 0, 0, h, dtype)
    out = flashattn_ext.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal, **kw)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ok = not any(t.isnan().any() for t in (out, *grads))
    errs = []
    for s, (a, b) in enumerate(lens):
        qs, ks = slice(int(cu_q[s]), int(cu_q[s + 1])), slice(int(cu_k[s]), int(cu_k[s + 1]))
        q64, k64, v64 = (t.detach()[None, r].double().requires_grad_() for t, r in ((q, qs), (k, ks), (v, ks)))
        ref_kw = {n: x for n, x in kw.items() if n not in ("alibi_slopes", "sink")}
        if "alibi_slopes" in kw:
            ref_kw["alibi_slopes"] = kw["alibi_slopes"][s:s + 1]
        if "sink" in kw:
            ref_kw["sink"] = kw["sink"].detach().double()
        ref = attention_ref(q64, k64, v64, causal=causal, **ref_kw)[0]
        if a == 0:
            continue
        ref_grads = torch.autograd.grad(ref, (q64, k64, v64), dout[None, qs].double(), allow_unused=True)
        errs.append(rel_err(out[qs], ref[0], floor=1.0))
        for g, r, rows in zip(grads, ref_grads, (qs, ks, ks)):
            if r is not None and b > 0:
                errs.append(rel_err(g[rows], r[0], floor=1.0))
    ok = ok and all(e <= TOLERANCE[dtype] for e in errs)
    print(f"{str(dtype):15s} varlen {lens} h{h}/{hkv} d{d} causal={causal} {var}: "
          f"max rel err {max(errs, default=0):.1e} {'ok' if ok else 'FAIL'}")
    return ok


def bad_varlen_indices():
    """cu_seqlens / seqused_k contents the binding cannot check without a sync: past the tensors'
    ends, negative, decreasing. The kernels clamp them; memcheck must stay clean."""
    q = torch.randn(50, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(40, 1, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(40, 1, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for cu_q, cu_k, used in (([0, 30, 10**6], [0, 20, 10**6], None), ([0, -7, 50], [5, 3, 40], None),
                             ([0, 25, 50], [0, 20, 40], [10**6, -3])):
        cu_q, cu_k = (torch.tensor(c, dtype=torch.int32, device="cuda") for c in (cu_q, cu_k))
        used = None if used is None else torch.tensor(used, dtype=torch.int32, device="cuda")
        out = flashattn_ext.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 64, 64, causal=True, seqused_k=used)
        torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    torch.cuda.synchronize()
    print("bad varlen indices: ran (results not checked; memcheck judges the accesses)")


def check_decode():
    """The decode kernel (fwd_decode.cu) with and without split-KV, through flash_attn_with_kvcache on dense and
    paged caches (GQA, leftpad, window, softcap, sink) against attention_ref on the gathered keys; then index
    contents the binding cannot check (block_table entries past the pages, cache_seqlens past the cache,
    negative leftpad), which the kernel clamps: memcheck judges those accesses. Returns the failures."""
    failures = 0
    b, h, hkv, d, page, pages_per_seq = 2, 8, 2, 128, 64, 12
    cache = page * pages_per_seq
    k = torch.randn(b, cache, hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, cache, hkv, d, device="cuda", dtype=torch.bfloat16)
    perm = torch.randperm(b * pages_per_seq, device="cuda")
    table = perm.view(b, pages_per_seq).to(torch.int32)
    k_paged, v_paged = (torch.empty_like(x.reshape(-1, page, hkv, d)) for x in (k, v))
    k_paged[perm] = k.reshape(-1, page, hkv, d)
    v_paged[perm] = v.reshape(-1, page, hkv, d)
    seqlens = torch.tensor([cache, 301], dtype=torch.int32, device="cuda")
    leftpad = torch.tensor([5, 0], dtype=torch.int32, device="cuda")
    sink = torch.randn(h, device="cuda")
    for sq, splits, paged, kw in ((1, 0, False, {}), (1, 5, True, dict(softcap=20.0)),
                                  (3, 3, False, dict(causal=True, window_size=(100, 0), sink=sink)),
                                  (4, 0, True, dict(causal=True, cache_leftpad=leftpad))):
        q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
        kc, vc, bt = (k_paged, v_paged, table) if paged else (k, v, None)
        out = flashattn_ext.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=bt,
                                                     num_splits=splits, **kw)
        errs = []
        for i in range(b):
            lo = int(kw["cache_leftpad"][i]) if "cache_leftpad" in kw else 0
            hi = int(seqlens[i])
            ref_kw = {name: kw[name] for name in ("causal", "window_size", "softcap") if name in kw}
            if "sink" in kw:
                ref_kw["sink"] = kw["sink"].double()
            ref = attention_ref(q[i:i + 1].double(), k[i:i + 1, lo:hi].double(), v[i:i + 1, lo:hi].double(),
                                **ref_kw)[0]
            errs.append(rel_err(out[i:i + 1], ref))
        ok = max(errs) <= TOLERANCE[torch.bfloat16]
        failures += not ok
        print(f"decode sq{sq} splits={splits} paged={paged} {sorted(kw)}: max rel err {max(errs):.1e} "
              f"{'ok' if ok else 'FAIL'}")
    q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16)
    bad_table = table.clone()
    bad_table[0, 3], bad_table[1, 0] = 10**6, -9
    for bt, sl, lp in ((bad_table, seqlens, None), (table, torch.tensor([10**6, -4], dtype=torch.int32, device="cuda"),
                                                    None), (table, seqlens, torch.tensor([-3, 10**6], dtype=torch.int32,
                                                                                         device="cuda"))):
        for splits in (0, 4):
            flashattn_ext.flash_attn_with_kvcache(q, k_paged, v_paged, cache_seqlens=sl, block_table=bt,
                                                  cache_leftpad=lp, num_splits=splits)
    torch.cuda.synchronize()
    print("bad decode indices: ran (results not checked; memcheck judges the accesses)")
    return failures


def t5_bias(table, buckets, sq, sk):
    """(1, h, sq, sk) float64: table[h, buckets[clamp(j - i', -R, R) + R]], i' = i + sk - sq."""
    radius = (buckets.numel() - 1) // 2
    rel = torch.arange(sk, device="cuda")[None, :] - torch.arange(sq, device="cuda")[:, None] - (sk - sq)
    return table.double()[:, buckets.long()[rel.clamp(-radius, radius) + radius]][None]


def check_rel_bias():
    """T5's rel_bias on the fp32 / fp64 kernels (dense GQA causal with sq != sk, a window, softcap; varlen), out and
    the gradients of q, k, v and the table against attention_ref with the bias as an additive mask; then
    rel_buckets entries outside [0, num_buckets) through the ops (the binding does not read them; the kernels
    clamp them): memcheck judges those accesses. Returns the failures."""
    failures = 0
    for dtype in (torch.float32, torch.float64):
        for b, sq, sk, causal, kw in ((2, 45, 70, True, {}), (1, 60, 33, False, dict(window_size=(9, 4), softcap=3.0))):
            q = torch.randn(b, sq, 4, 24, device="cuda", dtype=dtype, requires_grad=True)
            k = torch.randn(b, sk, 2, 24, device="cuda", dtype=dtype, requires_grad=True)
            v = torch.randn(b, sk, 2, 24, device="cuda", dtype=dtype, requires_grad=True)
            table = torch.randn(4, 16, device="cuda", dtype=dtype, requires_grad=True)
            out = flashattn_ext.flash_attn_func(q, k, v, causal=causal, rel_bias=table, rel_bias_max_distance=20,
                                                rel_bias_bidirectional=not causal, **kw)
            dout = torch.randn_like(out)
            grads = torch.autograd.grad(out, (q, k, v, table), dout)
            q64, k64, v64, t64 = (t.detach().double().requires_grad_() for t in (q, k, v, table))
            buckets = t5_buckets(16, 20, not causal, max(sq, sk), "cuda")
            ref = attention_ref(q64, k64, v64, causal=causal, attn_mask=t5_bias(t64, buckets, sq, sk), **kw)[0]
            ref_grads = torch.autograd.grad(ref, (q64, k64, v64, t64), dout.double())
            errs = [rel_err(out, ref)] + [rel_err(g, r) for g, r in zip(grads, ref_grads)]
            ok = all(e <= TOLERANCE[dtype] * 10 for e in errs)
            failures += not ok
            print(f"{str(dtype):15s} rel_bias b{b} sq{sq} sk{sk} causal={causal} {kw}: rel err out/grads "
                  f"{' '.join(f'{e:.1e}' for e in errs)} {'ok' if ok else 'FAIL'}")
        lens = [(30, 41), (0, 3), (17, 9)]
        cu_q, cu_k = cumulative([a for a, _ in lens]), cumulative([c for _, c in lens])
        q = torch.randn(47, 4, 8, device="cuda", dtype=dtype, requires_grad=True)
        k = torch.randn(53, 2, 8, device="cuda", dtype=dtype, requires_grad=True)
        table = torch.randn(4, 8, device="cuda", dtype=dtype, requires_grad=True)
        out = flashattn_ext.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 30, 41, causal=True, rel_bias=table,
                                                   rel_bias_max_distance=12, rel_bias_bidirectional=False)
        grads = torch.autograd.grad(out, (q, k, table), torch.ones_like(out))
        ok = not any(t.isnan().any() for t in (out, *grads))
        failures += not ok
        print(f"{str(dtype):15s} rel_bias varlen {lens}: {'ran' if ok else 'FAIL (NaN)'}")
        x = torch.randn(1, 9, 2, 8, device="cuda", dtype=dtype)
        bad = torch.tensor([3, -7, 10**6, 0, 1, 2, 10**9, -1, 5], dtype=torch.int32, device="cuda")  # R = 4
        table = torch.randn(2, 8, device="cuda", dtype=dtype)
        common = dict(q=x, k=x, v=x, softmax_scale=0.3, rel_bias=table, rel_buckets=bad)
        out, lse, rng = _core.fwd(**common)
        _core.bwd(dout=torch.ones_like(out), out=out, lse=lse, rng_state=rng, rel_bias_grad=True, **common)
    torch.cuda.synchronize()
    print("bad rel_buckets: ran (results not checked; memcheck judges the accesses)")
    return failures


def run(only_det=False, only_large=False):
    """Every call above (only_det: the deterministic configs; only_large: those with head dims above 256); returns the
    number of mismatches (each printed)."""
    torch.manual_seed(0)
    failures = 0
    if only_large:
        failures += sum(not check_varlen(*config) for config in VARLEN_CONFIGS if config[4] > 256)
    elif not only_det:
        failures += check_decode()
        for config in VARLEN_CONFIGS:
            failures += not check_varlen(*config)
        bad_varlen_indices()
        failures += check_rel_bias()
    for dtype, b, sq, sk, h, hkv, d, causal, det, var in CONFIGS:
        if (only_det and not det) or (only_large and d <= 256):
            continue
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
    return failures


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sanitizer_calls_match_the_reference():
    assert run() == 0


if __name__ == "__main__":
    raise SystemExit(1 if run("--det" in sys.argv[1:], "--large" in sys.argv[1:]) else 0)
