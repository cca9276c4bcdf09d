"""The d512 landing's A/B (dev/pending/README.md): time, in the tree on sys.path (PYTHONPATH), the calls whose kernels
it changed: the dense paged prefill at d <= 128 (flash_attn_with_kvcache, 1k / 2k queries against a paged bf16 cache,
now fwd_sm80's HOOK d128 paged kernel) and the fp32 simple kernels (flash_attn_func forward + backward, d 64 / 128 /
256). Prints one `name ms` line per config (bench_gpu.median_ms); run it in both trees in turn and divide."""
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "benchmarks"))
import flashattn_ext  # noqa: E402
from bench_gpu import median_ms  # noqa: E402

dev = torch.device("cuda")
torch.manual_seed(0)
for d in (64, 128):
    for sq, cache, causal in ((1024, 8192, True), (2048, 8192, False)):
        b, h, page = 4, 16, 256
        pages = b * cache // page
        kc = torch.randn(pages, page, h, d, device=dev, dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        table = torch.randperm(pages, device=dev, dtype=torch.int32).view(b, cache // page)
        q = torch.randn(b, sq, h, d, device=dev, dtype=torch.bfloat16)
        lens = torch.full((b,), cache, device=dev, dtype=torch.int32)
        fn = lambda: flashattn_ext.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table,
                                                          causal=causal)
        print(f"paged_prefill d{d} sq{sq} cache{cache} causal{int(causal)} {median_ms(fn, dev):.4f}", flush=True)
for d in (64, 128, 256):
    q, k, v = (torch.randn(1, 2048, 8, d, device=dev, dtype=torch.float32, requires_grad=True) for _ in range(3))
    out = flashattn_ext.flash_attn_func(q, k, v, causal=True)
    g = torch.randn_like(out)
    fwd = lambda: flashattn_ext.flash_attn_func(q, k, v, causal=True)
    bwd = lambda: torch.autograd.grad(flashattn_ext.flash_attn_func(q, k, v, causal=True), (q, k, v), g)
    print(f"fp32_fwd d{d} {median_ms(fwd, dev):.4f}", flush=True)
    print(f"fp32_fwd_bwd d{d} {median_ms(bwd, dev):.4f}", flush=True)
