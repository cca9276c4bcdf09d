"""One bf16 forward + backward of ours with ALiBi, then one with T5's table (learnable), same inputs (16k tokens,
2048 / headdim heads), for run_q.sh t5ncu: ncu profiles both backward main kernels in one process, to see where T5's
backward loses against ALiBi's (0.50-0.61x in h100/session_2026-12-07b).
    python3 t5_ncu.py HEADDIM SEQLEN CAUSAL"""
import sys

import torch

import flashattn_ext

d, s, causal = int(sys.argv[1]), int(sys.argv[2]), bool(int(sys.argv[3]))
b, h = 16384 // s, 2048 // d
q, k, v, g = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
q, k, v = (t.requires_grad_() for t in (q, k, v))
slopes = torch.pow(2.0, -torch.arange(1, h + 1, dtype=torch.float32, device="cuda") * (8.0 / h))
table = torch.randn(h, 32, device="cuda", dtype=torch.float32, requires_grad=True)
out = flashattn_ext.flash_attn_func(q, k, v, causal=causal, alibi_slopes=slopes)
torch.autograd.grad(out, (q, k, v), g)
out = flashattn_ext.flash_attn_func(q, k, v, causal=causal, rel_bias=table, rel_bias_max_distance=128,
                                    rel_bias_bidirectional=not causal)
torch.autograd.grad(out, (q, k, v, table), g)
torch.cuda.synchronize()
print("ran", flashattn_ext._C.last_cuda_kernels())
