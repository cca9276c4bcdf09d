"""Host time per call on a GPU machine (from the repo root, the extension built): tiny CUDA tensors, calls queued
without sync (host-bound), ours beside SDPA's cuDNN / flash backends; then cProfile of ours (Python vs the op)."""
import time, cProfile, pstats, torch, flashattn_ext
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
q = torch.randn(1, 16, 16, 64, device="cuda", dtype=torch.bfloat16)
def bench(f, n=2000):
    for _ in range(100): f()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): f()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host
qt = q.transpose(1, 2)
op = torch.ops.flashattn_ext.fwd
for grad in (False, True):
    qg = q.detach().clone().requires_grad_(grad); qtg = qg.transpose(1, 2)
    with torch.set_grad_enabled(True):
        print(f"grad={grad}: ours {bench(lambda: flashattn_ext.flash_attn_func(qg, qg, qg)):.1f} us", end="")
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            with sdpa_kernel(be):
                print(f"  {name} {bench(lambda: F.scaled_dot_product_attention(qtg, qtg, qtg)):.1f} us", end="")
        print()
with torch.no_grad():
    print(f"raw op (no grad) {bench(lambda: op(q, q, q, 0.125)):.1f} us")
cProfile.run("for _ in range(2000): flashattn_ext.flash_attn_func(q, q, q)", "/tmp/prof")
torch.cuda.synchronize()
pstats.Stats("/tmp/prof").sort_stats("tottime").print_stats(12)
