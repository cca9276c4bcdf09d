"""A float32 emulation, on the CPU, of the CUDA kernels' arithmetic for additive attn_mask entries at finfo.min (score.h
"Huge additive entries", issue 33): the forward in fwd_sm80's raw units (P = exp2(fma(x, scale_log2, -m scale_log2)),
lse = (m scale_log2 + log2 l) ln 2), the backward preprocess's row fix (huge_rows.cuh huge_row_fix: dO / l, lse_fix
= +-HUGE) and bwd_sm90's main-kernel step in units of mul (P = exp2(fma(s, mul, -lse2)), lse2 = lse_fix mul through
bwd_common.cuh lse_to_log2_hook), on test_variants.py's test_float_mask_rows_at_finfo_min tensors (plus a row with
+huge keys), against torch's float32 math on the same rounded inputs (out, dq, dk, dv, dmask: relative errors
~1e-7 expected). Checks the design's exactness argument, not the CUDA code. Usage: python3 dev/tools/huge_rows_emulate.py
"""
import math

import numpy as np
import torch

f32 = np.float32
LOG2E = f32(1.4426950408889634); LN2 = f32(1 / 1.4426950408889634)
HUGE, HMIN = f32(2.0**100), f32(2.0**28)
def fma(a, b, c): return (a.astype(np.float64) * b + c).astype(f32)
def clamp_add(x, e, tu):
    a = np.abs(e); huge = (a >= HMIN) & (a < np.inf)
    y = (x + e * tu).astype(f32)
    return np.where(huge, np.where(e < 0, -HUGE, HUGE), y).astype(f32)
def run(dtype, mask_mode):
    b, h, sq, sk, d = 2, 3, 40, 70, 16
    gen = torch.Generator().manual_seed(0)
    q, dout = (torch.randn(b, h, sq, d, generator=gen, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(b, h, sk, d, generator=gen, dtype=torch.float64) for _ in range(2))
    mask = torch.randn(b, 1, sq, sk, generator=gen, dtype=torch.float64)
    low = torch.finfo(dtype).min
    mask[0, 0, :5] = low; mask[0, 0, 30] = -1e9; mask[0, 0, 31, ::2] = low; mask[0, 0, 32:, 60:] = low
    cm = torch.ones(sq, sk, dtype=torch.bool).tril(0)
    mask[1] = mask[1].masked_fill(~cm, low); mask[1, 0, 17:20] = low
    if mask_mode == "pos": mask[0, 0, 10, 3:6] = 1e30   # a row with +huge keys
    t = [x.to(dtype) for x in (q, k, v, dout)] + [mask.clamp_min(low).to(dtype)]
    Q, K, V, DO, M = (x.double().numpy().astype(f32) for x in t)
    M = np.broadcast_to(M, (b, h, sq, sk))
    scale = f32(1 / math.sqrt(d)); sl2 = f32(scale * LOG2E)
    # forward, raw units (to_raw = log2e / sl2)
    to_raw = f32(LOG2E / sl2)
    X = clamp_add((Q @ K.transpose(0, 1, 3, 2)).astype(f32), M, to_raw)
    m = X.max(-1, keepdims=True); ms = (m * sl2).astype(f32)
    P = np.exp2(fma(X, sl2, -ms)); l = P.sum(-1, keepdims=True, dtype=f32)
    O = ((P @ V) / l).astype(f32)
    lse = (((m * sl2).astype(f32) + np.log2(l)) * LN2).astype(f32)[..., 0]
    # preprocess fix
    mul = sl2; lse_huge = HUGE  # natural units; the sm90 kernel maps it to HUGE mul
    a = np.abs(M); hg = (a >= HMIN) & (a < np.inf)
    pos = (hg & (M > 0)).sum(-1); neg = (hg & (M < 0)).sum(-1); other = (~hg & (M > -np.inf)).sum(-1)
    scan = (np.abs(lse) >= 2.0**32) & np.isfinite(lse)
    fixp = scan & (pos > 0); fixn = scan & (pos == 0) & (other == 0) & (neg > 0)
    L = np.where(fixp, pos, np.where(fixn, neg, 1)).astype(f32)
    lse_fix = np.where(fixp, lse_huge, np.where(fixn, -lse_huge, lse)).astype(f32)
    DOp = (DO / L[..., None]).astype(f32)
    lse2 = np.where(np.abs(lse_fix) >= 2.0**64, (lse_fix * mul).astype(f32), (lse_fix * LOG2E).astype(f32))
    # backward main kernel, units of mul (to_units = log2e / mul)
    tu = f32(LOG2E / mul)
    S8 = clamp_add((Q @ K.transpose(0, 1, 3, 2)).astype(f32), M, tu)
    Pk = np.exp2(fma(S8, mul, -lse2[..., None]))
    delta = (DOp * O).sum(-1, keepdims=True, dtype=f32)
    dV = Pk.transpose(0, 1, 3, 2) @ DOp; dP = DOp @ V.transpose(0, 1, 3, 2); dS = Pk * (dP - delta)
    dQ = scale * dS @ K; dK = scale * dS.transpose(0, 1, 3, 2) @ Q
    got = [O, dQ, dK, dV, dS.sum(1, keepdims=True)]
    # torch float32 math on the same (rounded) inputs
    leaves = [torch.tensor(x, dtype=torch.float32, requires_grad=True) for x in (Q, K, V)]
    mk = torch.tensor(np.ascontiguousarray(M[:, :1]), dtype=torch.float32, requires_grad=True)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(*leaves, attn_mask=mk)
    g = torch.autograd.grad(ref, leaves + [mk], torch.tensor(DO, dtype=torch.float32))
    for name, x, r in zip(("out", "dq", "dk", "dv", "dmask"), got, [ref] + list(g)):
        r = r.detach().numpy(); err = np.linalg.norm(x - r) / np.linalg.norm(r)
        print(f"{str(dtype):15s} {mask_mode:4s} {name:5s} rel err {err:.2e} finite {np.isfinite(x).all()}")
    print("   rows fixed: +", int(fixp.sum()), " -", int(fixn.sum()))
if __name__ == "__main__":
    np.seterr(over="ignore", invalid="ignore")
    for dt in (torch.bfloat16, torch.float32):
        for mm in ("", "pos"):
            run(dt, mm)
