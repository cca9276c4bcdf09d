"""One backward of cuDNN's SDPA and one of ours on the same bf16 inputs (batch 16k / seqlen, 2048 / headdim heads,
causal or not), for `dev/device.sh ncu pair`: ncu profiles both main kernels in one process, on one shape.
    python3 dev/tools/bwd_pair.py HEADDIM SEQLEN CAUSAL"""
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn_ext

d, s, causal = int(sys.argv[1]), int(sys.argv[2]), bool(int(sys.argv[3]))
b, h = 16384 // s, 2048 // d
q, k, v, g = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
q, k, v = (t.requires_grad_() for t in (q, k, v))
qt, kt, vt, gt = (t.transpose(1, 2) for t in (q, k, v, g))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    torch.autograd.grad(out, (q, k, v), gt)
out = flashattn_ext.flash_attn_func(q, k, v, causal=causal)
torch.autograd.grad(out, (q, k, v), g)
torch.cuda.synchronize()
print("ran", flashattn_ext._C.last_cuda_kernels())
