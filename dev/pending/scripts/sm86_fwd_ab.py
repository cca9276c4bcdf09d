"""i36_sm86_fwd's A/B (dev/pending/README.md): time, in the tree on PYTHONPATH, fwd_sm80's forwards whose machine
code the patch changed (run with FLASHATTN_EXT_DISABLE_SM90=1): the d256 kernels (second body), dense / causal /
softcap (HOOK) / dropout (HOOK), and the dense paged d64 prefill. With FLASHATTN_EXT_SMEM_LIMIT=101376 the d256 rows
time the small tiles (sm86 / sm89's). Prints `name ms` per config (bench_gpu.median_ms)."""
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "benchmarks"))
import flashattn_ext  # noqa: E402
from bench_gpu import median_ms  # noqa: E402

dev = torch.device("cuda")
torch.manual_seed(0)
for s in (2048, 8192):
    b, h, d = 16384 // s, 8, 256
    q, k, v = (torch.randn(b, s, h, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
    for name, kw in (("dense", {}), ("causal", {"causal": True}), ("softcap", {"softcap": 30.0}),
                     ("dropout", {"dropout_p": 0.1})):
        fn = lambda: flashattn_ext.flash_attn_func(q, k, v, **kw)
        print(f"d256_{name} s{s} {median_ms(fn, dev):.4f}", flush=True)
b, h, d, page, cache, sq = 4, 16, 64, 256, 8192, 1024
kc = torch.randn(b * cache // page, page, h, d, device=dev, dtype=torch.bfloat16)
vc = torch.randn_like(kc)
table = torch.randperm(b * cache // page, device=dev, dtype=torch.int32).view(b, cache // page)
q = torch.randn(b, sq, h, d, device=dev, dtype=torch.bfloat16)
lens = torch.full((b,), cache, device=dev, dtype=torch.int32)
fn = lambda: flashattn_ext.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True)
print(f"paged_prefill_d64 {median_ms(fn, dev):.4f}", flush=True)
