"""i34_t5_half's A/B (dev/pending/README.md), ours only: time, in the tree on PYTHONPATH, the bf16 calls whose kernels
the patch changed (every HOOK kernel: softcap, ALiBi, padding mask, dropout; the decode kernels) beside dense rows
(unchanged kernels, the noise floor), forward and forward + backward, and T5 itself where the tree has it (main raises:
`t5 ... err`). Prints `name ms` per config (bench_gpu.median_ms); run it in both trees in turn and divide. With
FLASHATTN_EXT_DISABLE_SM90=1 it times the sm80 path."""
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "benchmarks"))
import flashattn_ext  # noqa: E402
from bench_gpu import median_ms  # noqa: E402
from flashattn_ext._checks import t5_buckets  # noqa: E402, F401  (main has it too: the buckets' helper)

import os  # noqa: E402
DRY = os.environ.get("T5_AB_DRY") == "1"  # a CPU smoke run of this script: tiny shapes, fp32
dev, dt = (torch.device("cpu"), torch.float32) if DRY else (torch.device("cuda"), torch.bfloat16)
torch.manual_seed(0)
TOKENS, HIDDEN = (256, 128) if DRY else (16384, 2048)


SKIP_T5 = os.path.basename(os.getcwd()) == os.environ.get("T5_AB_SKIP_T5_IN")  # main's T5 runs the fp32 kernels
# only the rows whose kernels a T5 tree changes (the HOOK ones; dense and causal run SASS-identical kernels there)
ONLY_HOOK = os.environ.get("T5_AB_ONLY_HOOK") == "1"


def row(name, d, s, kw, mask=None, bwd=True):
    if (SKIP_T5 and "rel_bias" in kw) or (ONLY_HOOK and name in ("dense", "causal")):
        return
    b, h = TOKENS // s, HIDDEN // d
    q, k, v = (torch.randn(b, s, h, d, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    if mask is not None:
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        m = mask(b, s)
        fn = lambda: flashattn_ext.scaled_dot_product_attention(qt, kt, vt, attn_mask=m)
    else:
        kw = {k_: (val(h) if callable(val) else val) for k_, val in kw.items()}
        fn = lambda: flashattn_ext.flash_attn_func(q, k, v, **kw)
    try:
        out = fn()
        g = torch.randn_like(out)
        leaves = [q, k, v] + [t for t in kw.values() if torch.is_tensor(t) and t.requires_grad] if mask is None else [q, k, v]
        print(f"{name} d{d} s{s} fwd {median_ms(fn, dev):.4f}", flush=True)
        if bwd:
            step = lambda: torch.autograd.grad(fn(), leaves, g)
            print(f"{name} d{d} s{s} fwd_bwd {median_ms(step, dev):.4f}", flush=True)
    except (RuntimeError, ValueError, TypeError) as e:
        print(f"{name} d{d} s{s} err {str(e).splitlines()[0][:80]}", flush=True)


def slopes(h):
    return torch.pow(2.0, -torch.arange(1, h + 1, dtype=torch.float32, device=dev) * (8.0 / h))


def table(h):
    return torch.randn(h, 32, device=dev, dtype=torch.float32).requires_grad_()


def keypad(b, s):
    lengths = torch.randint(s * 3 // 4, s + 1, (b,), generator=torch.Generator().manual_seed(0))
    return (torch.arange(s)[None, :] < lengths[:, None])[:, None, None, :].to(dev)


S = (lambda s: 128 if DRY else s)
for d, s in ((64, S(8192)), (128, S(2048)), (128, S(8192)), (256, S(8192))):
    row("dense", d, s, {})
    row("causal", d, s, {"causal": True})
    row("softcap", d, s, {"softcap": 50.0})
for d, s in ((64, S(8192)), (128, S(2048)), (128, S(8192))):
    row("alibi_causal", d, s, {"causal": True, "alibi_slopes": slopes})
    row("t5_causal", d, s, {"causal": True, "rel_bias": table, "rel_bias_max_distance": 128,
                            "rel_bias_bidirectional": False})
row("alibi", 128, S(8192), {"alibi_slopes": slopes})
row("t5", 128, S(8192), {"rel_bias": table, "rel_bias_max_distance": 128})
row("window", 128, S(8192), {"window_size": (1023, 0)})
row("padding", 128, S(8192), {}, mask=keypad)
row("dropout", 128, S(8192), {"dropout_p": 0.1})
# decode: one query against an 8k cache (dense, ALiBi, softcap), bf16
for d in (64, 128):
    b, h, cache = 32, HIDDEN // d, S(8192)
    kc = torch.randn(b, cache, h, d, device=dev, dtype=dt)
    vc = torch.randn_like(kc)
    q = torch.randn(b, 1, h, d, device=dev, dtype=dt)
    lens = torch.full((b,), cache - 17, device=dev, dtype=torch.int32)
    for name, kw in (("decode", {}), ("decode_alibi", {"alibi_slopes": slopes(h)}), ("decode_softcap", {"softcap": 30.0})):
        fn = lambda: flashattn_ext.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, **kw)
        print(f"{name} d{d} fwd {median_ms(fn, dev):.4f}", flush=True)
