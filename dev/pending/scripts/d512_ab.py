"""i36_d512_cluster's A/B (dev/pending/README.md): time, in the tree on sys.path (PYTHONPATH), the bf16 backward at
head dims above 256 (flash_attn_func forward + backward, and the forward alone, 16k tokens, 16 heads; d 512 and 320,
seqlen 2k / 8k, causal and not). Prints one `name ms` line per config (bench_gpu.median_ms); run it in both trees in
turn (run_q.sh d512ab) and divide."""
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "benchmarks"))
import flashattn_ext  # noqa: E402
from bench_gpu import median_ms  # noqa: E402

dev = torch.device("cuda")
torch.manual_seed(0)
for d in (512, 320):
    for s in (2048, 8192):
        for causal in (False, True):
            q, k, v = (torch.randn(16384 // s, s, 16, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            g = torch.randn_like(q)
            fwd = lambda: flashattn_ext.flash_attn_func(q, k, v, causal=causal)
            both = lambda: torch.autograd.grad(flashattn_ext.flash_attn_func(q, k, v, causal=causal), (q, k, v), g)
            name = f"d{d} s{s} causal{int(causal)}"
            print(f"fwd {name} {median_ms(fwd, dev):.4f}", flush=True)
            print(f"fwd_bwd {name} {median_ms(both, dev):.4f}", flush=True)
