"""Shared helpers of the flashattn_ext tests.

* `attention64`: an independent eager float64 reference (scores, mask, softmax, @ v) with every
  variant (window, softcap, ALiBi, attn_mask, sink, dropout keep mask) written here, not imported from
  the library, so that flashattn_ext.reference.attention_ref is tested too.
* `Var`, `make_variant_tensors`, `variant_reference`, `check_variant_results`: the variants of a call,
  their tensors, the float64 results with gradients and error scales, and the comparison.
* `philox_keep_mask`: an independent numpy Philox4x32-10 of the dropout stream documented in csrc/mask.h.
* `SAMPLES`: the one list of configurations feeding correctness, gradient, opcheck and compile tests.
* `make_inputs`: builds q, k, v (and dout) for a configuration, in one of several memory layouts.
* tolerances and comparison helpers (relative L2 error against the float64 reference).
"""
import contextlib
import dataclasses
import math
import os
import subprocess
import sys
import zlib

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")

HALF_DTYPES = (torch.float16, torch.bfloat16)
DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}

# Relative L2 error ||x - ref|| / ||ref|| against the float64 reference computed from the same
# (upcast) inputs.
OUT_TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5, torch.float64: 1e-12}


def grad_tol(dtype):
    """Gradients: same as the forward for fp32/fp64. For fp16/bf16 twice the forward threshold: the
    backward rounds P, dS and dout to half precision before three more matmuls (dV = P^T dO,
    dQ = dS K, dK = dS^T Q), so it carries about twice the rounding of the forward."""
    return OUT_TOL[dtype] * (2.0 if dtype in HALF_DTYPES else 1.0)


# (device, dtype) pairs: CPU supports fp32/fp64; CUDA fp16/bf16/fp32/fp64.
DEVICE_DTYPES = [("cpu", dt) for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64)] + [
    ("cuda", dt) for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
]


def device_dtype_params(pairs=DEVICE_DTYPES):
    return [
        pytest.param(dev, dt, id=f"{dev}-{DTYPE_NAMES[dt]}", marks=[requires_cuda] if dev == "cuda" else [])
        for dev, dt in pairs
    ]


DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=requires_cuda)]


# ----------------------------------------------------------------------------------------------
# The independent reference
# ----------------------------------------------------------------------------------------------

def causal_mask(sq, sk, bottom_right, device="cpu"):
    """(sq, sk) bool, True where query i sees key j.
    bottom-right (flash_attn_func): j <= i + sk - sq;  top-left (SDPA is_causal): j <= i."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    return j <= i + ((sk - sq) if bottom_right else 0)


def band_mask(sq, sk, causal, bottom_right, window=(-1, -1), device="cpu"):
    """(sq, sk) bool: key j visible to query i by position. With a = sk - sq (bottom-right) or 0
    (top-left): a - left <= j - i <= a + right, -1 unbounded, causal meaning right = 0."""
    left, right = window
    a = (sk - sq) if bottom_right else 0
    lo = -math.inf if left < 0 else a - left
    hi = a if causal else (math.inf if right < 0 else a + right)
    t = (torch.arange(sk, device=device)[None, :] - torch.arange(sq, device=device)[:, None]).to(torch.float64)
    return (t >= lo) & (t <= hi)


DROPOUT_ONE = 2 ** 32  # the draws are uniform 32-bit integers


def dropout_threshold(dropout_p):
    """mask.h flash_dropout_set: round(p * 2^32) (half away from zero), at least 1 for p > 0; 0: no dropout."""
    if dropout_p <= 0.0:
        return 0
    return max(1, min(math.floor(dropout_p * DROPOUT_ONE + 0.5), DROPOUT_ONE))


def keep_probability(dropout_p):
    """Dropout keeps an element iff its 32-bit draw is >= dropout_threshold(p): with probability
    1 - threshold / 2^32, which is 1 - p to within 2^-33."""
    return (DROPOUT_ONE - dropout_threshold(dropout_p)) / DROPOUT_ONE


def dropout_scale(dropout_p):
    """The factor of a kept value: 1 / (1 - p) of p as given (0 when nothing is kept)."""
    return 0.0 if dropout_threshold(dropout_p) == DROPOUT_ONE else 1.0 / (1.0 - dropout_p)


def attention64(q, k, v, scale=None, causal=False, bottom_right=True, *, window=(-1, -1), softcap=0.0,
                alibi_slopes=None, sink=None, attn_mask=None, dropout_p=0.0, keep=None, internals=False):
    """Eager float64 attention. q: (B, Sq, H, D); k: (B, Sk, Hkv, D); v: (B, Sk, Hkv, Dv), Dv any (v's
    own head dim); H a multiple of Hkv (query head h uses kv head h // (H / Hkv)). Returns out (B, Sq, H, Dv)
    and lse (B, H, Sq), float64; scale defaults to 1 / sqrt(D).

    Variants (flash-attn >= 2.6 semantics; see band_mask for causal / window):
      softcap > 0     s = softcap * tanh(s / softcap) on the scaled score s = scale * q.k
      alibi_slopes    (H,) or (B, H): s -= slope * |i + Sk - Sq - j|
      attn_mask       bool (True = take part) or floating, added to s; broadcastable to (B, H, Sq, Sk)
      sink            (H,): the denominator of every row of head h gains exp(sink[h])
      keep            (B, H, Sq, Sk) bool keep mask of dropout: P * keep / (1 - p_q) multiplies v
    Rows that see no key give out = 0, lse = -inf (lse = sink with a sink), and no NaN in any
    gradient: hidden scores become -inf before exp, the row maximum is taken over visible keys only,
    and an empty row's zero denominator is replaced by 1.
    internals=True also returns (detached) p, the probabilities (B, H, Sq, Sk) before dropout, and
    dcap, the derivative of the final score by scale * q.k (the softcap factor; 1 without softcap)."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    dev = q.device
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    kv_head = torch.arange(H, device=dev) // (H // Hkv)
    kx = k.index_select(2, kv_head)                                 # (B, Sk, H, D)
    vx = v.index_select(2, kv_head)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kx) * scale              # (B, H, Sq, Sk)
    dcap = torch.ones((), dtype=torch.float64, device=dev)
    if softcap > 0:
        s = torch.tanh(s / softcap) * softcap
        dcap = 1.0 - (s.detach() / softcap) ** 2                   # 1 - tanh^2 of the uncapped s / softcap
    if alibi_slopes is not None:
        slope = alibi_slopes.detach().to(device=dev, dtype=torch.float64)
        slope = slope.view(1, H, 1, 1) if slope.dim() == 1 else slope.view(B, H, 1, 1)
        i = torch.arange(Sq, device=dev, dtype=torch.float64)[:, None]
        j = torch.arange(Sk, device=dev, dtype=torch.float64)[None, :]
        s = s - slope * (i + (Sk - Sq) - j).abs()
    vis = band_mask(Sq, Sk, causal, bottom_right, window, dev).expand(B, H, Sq, Sk)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            vis = vis & attn_mask.to(dev)
        else:
            s = s + attn_mask.to(device=dev, dtype=torch.float64)
            vis = vis & (s.detach() > -math.inf)
    neg_inf = torch.tensor(-math.inf, dtype=torch.float64, device=dev)
    s_vis = torch.where(vis, s, neg_inf)
    m = s_vis.detach().amax(-1, keepdim=True)                       # -inf on rows without keys
    if sink is not None:
        sink64 = sink.to(device=dev, dtype=torch.float64).view(1, H, 1, 1)
        m = torch.maximum(m, sink64.detach())
    m = torch.where(m == -math.inf, torch.zeros_like(m), m)
    e = torch.exp(s_vis - m)                                        # 0 where hidden
    denom = e.sum(-1, keepdim=True)
    if sink is not None:
        denom = denom + torch.exp(sink64 - m)
    empty = denom.detach() == 0
    p = e / torch.where(empty, torch.ones_like(denom), denom)
    lse = (m + torch.log(denom.detach())).squeeze(-1)               # log 0 = -inf on empty rows
    p_undropped = p.detach()
    if keep is not None:
        p = p * keep.to(dev).to(torch.float64) * dropout_scale(dropout_p)
    out = torch.einsum("bhqk,bkhe->bqhe", p, vx)                    # (B, Sq, H, Dv)
    if internals:
        return out, lse, p_undropped, dcap
    return out, lse


# Below this many multiply-adds (B * H * Sq * Sk * D) the reference runs on one thread: torch's
# intra-op threads cost more than they save on small tensors (4-20x on a busy 2-core machine).
SMALL_REFERENCE_WORK = 1 << 22


@contextlib.contextmanager
def reference_threads(q, k):
    """One intra-op thread for a small reference computation on the CPU, restored afterwards."""
    small = q.shape[0] * q.shape[2] * q.shape[1] * k.shape[1] * max(1, q.shape[3]) < SMALL_REFERENCE_WORK
    saved = torch.get_num_threads()
    if small:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if small:
            torch.set_num_threads(saved)


def reference_with_grads(q, k, v, dout, scale=None, causal=False, bottom_right=True):
    """float64 out, lse, dq, dk, dv (all on the CPU) for the given (any dtype/device) inputs."""
    with reference_threads(q, k):
        q64, k64, v64 = (t.detach().cpu().to(torch.float64).requires_grad_() for t in (q, k, v))
        out, lse = attention64(q64, k64, v64, scale, causal, bottom_right)
        if dout is None:
            return out.detach(), lse, None, None, None
        dq, dk, dv = torch.autograd.grad(out, (q64, k64, v64), dout.detach().cpu().to(torch.float64))
    return out.detach(), lse, dq, dk, dv


# ----------------------------------------------------------------------------------------------
# Configurations
# ----------------------------------------------------------------------------------------------

LAYOUTS = (
    "contig",     # (B, S, H, D) contiguous
    "bhsd",       # made as (B, H, S, D) contiguous, then transposed to (B, S, H, D)
    "slice",      # a [..., 2:2+D] slice of a (B, S, H, D + 5) tensor: odd row/head strides + offset
    "kvpacked",   # k, v = kv[:, :, 0], kv[:, :, 1] of one (B, Sk, 2, Hkv, D) tensor
    "qkvpacked",  # q, k, v = unbind(2) of one (B, S, 3, H, D) tensor (needs sq == sk, H == Hkv)
    "mixed",      # q bhsd, k contig, v slice, dout bhsd: every tensor with its own strides
    "bcast",      # k, v expanded from (1, Sk, 1, D): stride 0 on batch and heads
)


@dataclasses.dataclass(frozen=True)
class Cfg:
    b: int
    sq: int
    sk: int
    h: int
    hkv: int
    d: int
    causal: bool = False
    scale: float = None          # None: default 1/sqrt(d)
    layout: str = "contig"
    dv: int = None               # v's (and out's) head dim; None: d

    def __post_init__(self):
        assert self.h % self.hkv == 0 and self.layout in LAYOUTS
        assert self.layout != "qkvpacked" or (self.sq == self.sk and self.h == self.hkv)
        assert self.layout not in ("kvpacked", "qkvpacked") or self.d_v == self.d

    @property
    def d_v(self):
        return self.d if self.dv is None else self.dv

    @property
    def id(self):
        s = f"b{self.b}-q{self.sq}-k{self.sk}-h{self.h}/{self.hkv}-d{self.d}"
        if self.causal:
            s += "-causal"
        if self.scale is not None:
            s += f"-scale{self.scale:g}"
        if self.layout != "contig":
            s += f"-{self.layout}"
        if self.dv is not None:
            s += f"-dv{self.dv}"
        return s

    @property
    def seed(self):
        return zlib.crc32(self.id.encode())

    def supports(self, device, dtype):
        """CUDA fp16/bf16 kernels take head dims that are multiples of 8, up to 256."""
        return dtype not in HALF_DTYPES or all(d % 8 == 0 and d <= 256 for d in (self.d, self.d_v))


SAMPLES = [
    # lengths 1
    Cfg(1, 1, 1, 1, 1, 1),
    Cfg(1, 1, 1, 2, 2, 8, causal=True),
    Cfg(2, 1, 7, 2, 1, 3),
    Cfg(1, 1, 257, 4, 1, 64, causal=True),             # decode row: bottom-right sees every key
    Cfg(1, 7, 1, 2, 2, 16),                            # sk = 1: dq = dk = 0 exactly
    Cfg(1, 257, 1, 1, 1, 8, causal=True),              # only the last row sees a key
    Cfg(1, 65, 1, 4, 1, 32),
    # seqlen_q == seqlen_k: primes, non-multiples of 64, multiples of 64
    Cfg(1, 7, 7, 1, 1, 1, causal=True),
    Cfg(2, 7, 7, 2, 2, 3, scale=0.7),
    Cfg(1, 31, 31, 4, 2, 8, causal=True),
    Cfg(1, 31, 31, 8, 1, 16),                          # GQA 8
    Cfg(1, 127, 127, 2, 1, 32, causal=True),
    Cfg(1, 127, 127, 2, 2, 64, layout="bhsd"),
    Cfg(1, 257, 257, 1, 1, 64, causal=True),
    Cfg(1, 257, 257, 2, 1, 16, layout="slice"),
    Cfg(1, 65, 65, 2, 2, 80),
    Cfg(1, 65, 65, 4, 1, 96, causal=True, layout="kvpacked"),
    Cfg(2, 130, 130, 2, 2, 128, causal=True),
    Cfg(1, 130, 130, 2, 1, 200),
    Cfg(1, 200, 200, 2, 2, 256, causal=True),
    Cfg(1, 200, 200, 4, 4, 32, layout="mixed"),
    Cfg(2, 64, 64, 2, 2, 64, causal=True),
    Cfg(1, 128, 128, 2, 2, 128, causal=True, layout="qkvpacked"),
    Cfg(1, 256, 256, 1, 1, 64, causal=True, layout="qkvpacked"),
    # seqlen_q < seqlen_k
    Cfg(1, 7, 31, 2, 2, 8, causal=True),
    Cfg(2, 31, 127, 8, 1, 32, causal=True),            # GQA 8
    Cfg(1, 65, 130, 2, 1, 64, causal=True, layout="bhsd"),
    Cfg(1, 64, 200, 2, 2, 128),
    Cfg(1, 13, 257, 1, 1, 200, causal=True),
    Cfg(1, 31, 65, 2, 2, 256),
    Cfg(1, 127, 200, 4, 2, 80, causal=True, scale=0.05),
    Cfg(1, 1, 130, 4, 2, 96, layout="slice"),
    Cfg(3, 7, 257, 2, 1, 1, causal=True),
    # seqlen_q > seqlen_k: bottom-right causal leaves the first sq - sk rows without keys
    Cfg(1, 31, 7, 2, 2, 8, causal=True),
    Cfg(1, 31, 7, 2, 2, 8),
    Cfg(2, 127, 31, 4, 2, 64, causal=True),
    Cfg(1, 130, 65, 2, 1, 128, causal=True, layout="mixed"),
    Cfg(1, 200, 64, 8, 4, 16, causal=True),
    Cfg(1, 257, 127, 2, 2, 3, causal=True, scale=0.3),
    Cfg(1, 65, 31, 2, 2, 256, causal=True),
    Cfg(2, 65, 130, 4, 2, 192, causal=True, layout="bhsd"),   # GQA above d128 (Hopper: the d256 wgmma kernel)
    Cfg(2, 200, 130, 4, 4, 8, layout="bhsd"),
    # batch > 1 with strides / custom scales
    Cfg(3, 65, 65, 4, 2, 64, causal=True, layout="kvpacked"),
    Cfg(4, 31, 31, 2, 2, 16, scale=1.0),
    Cfg(2, 65, 127, 6, 2, 32, scale=0.125, layout="mixed"),   # GQA 3
    Cfg(2, 31, 31, 4, 4, 8, causal=True, layout="qkvpacked"),
    Cfg(3, 31, 65, 4, 2, 32, causal=True, layout="bcast"),
    Cfg(2, 130, 130, 2, 2, 64, layout="bcast"),
]

SAMPLE_BY_ID = {c.id: c for c in SAMPLES}
assert len(SAMPLE_BY_ID) == len(SAMPLES)

# Small subsets (by id) for the slower opcheck / torch.compile tests: GQA, causal with empty rows,
# strided layouts, length 1, custom scale.
SMOKE_IDS = [
    "b2-q1-k7-h2/1-d3",
    "b1-q31-k7-h2/2-d8-causal",
    "b1-q65-k65-h4/1-d96-causal-kvpacked",
    "b2-q65-k127-h6/2-d32-scale0.125-mixed",
]
SMOKE = [SAMPLE_BY_ID[i] for i in SMOKE_IDS]


def sample_params(samples=SAMPLES, pairs=DEVICE_DTYPES):
    """pytest params (cfg, device, dtype) for every supported combination."""
    out = []
    for dev, dt in pairs:
        for cfg in samples:
            if cfg.supports(dev, dt):
                marks = [requires_cuda] if dev == "cuda" else []
                out.append(pytest.param(cfg, dev, dt, id=f"{dev}-{DTYPE_NAMES[dt]}-{cfg.id}", marks=marks))
    return out


# ----------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------

def make_inputs(cfg, dtype, device, requires_grad=True, seed=None):
    """q (B, Sq, H, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv), dout (B, Sq, H, Dv) in cfg.layout (Dv = cfg.d_v).
    With requires_grad, q/k/v are views of leaf tensors that require grad (use torch.autograd.grad
    with respect to the views)."""
    gen = torch.Generator().manual_seed(cfg.seed if seed is None else seed)
    B, Sq, Sk, H, Hkv, D, Dv = cfg.b, cfg.sq, cfg.sk, cfg.h, cfg.hkv, cfg.d, cfg.d_v

    def rnd(*shape):
        t = torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)
        return t.requires_grad_(requires_grad)

    def contig(s, h, d=D):
        return rnd(B, s, h, d)

    def bhsd(s, h, d=D):
        return rnd(B, h, s, d).transpose(1, 2)

    def sliced(s, h, d=D):
        return rnd(B, s, h, d + 5)[..., 2:2 + d]

    layout = cfg.layout
    if layout == "contig":
        q, k, v = contig(Sq, H), contig(Sk, Hkv), contig(Sk, Hkv, Dv)
    elif layout == "bhsd":
        q, k, v = bhsd(Sq, H), bhsd(Sk, Hkv), bhsd(Sk, Hkv, Dv)
    elif layout == "slice":
        q, k, v = sliced(Sq, H), sliced(Sk, Hkv), sliced(Sk, Hkv, Dv)
    elif layout == "kvpacked":
        q = sliced(Sq, H)
        kv = rnd(B, Sk, 2, Hkv, D)
        k, v = kv[:, :, 0], kv[:, :, 1]
    elif layout == "qkvpacked":
        q, k, v = rnd(B, Sq, 3, H, D).unbind(2)
    elif layout == "mixed":
        q, k, v = bhsd(Sq, H), contig(Sk, Hkv), sliced(Sk, Hkv, Dv)
    elif layout == "bcast":
        q = contig(Sq, H)
        k, v = (rnd(1, Sk, 1, d).expand(B, Sk, Hkv, d) for d in (D, Dv))
    else:
        raise AssertionError(layout)
    dout = torch.randn(B, Sq, H, Dv, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)
    if layout == "mixed":
        dout = dout.transpose(1, 2).contiguous().transpose(1, 2)
    elif layout == "slice":  # last-dim stride 2: the backward has to cope (autograd hands it over as is)
        dout = torch.stack([dout, torch.zeros_like(dout)], -1).flatten(-2)[..., ::2]
    for t, d in ((q, D), (k, D), (v, Dv)):
        assert t.shape[-1] == d and (t.numel() == 0 or t.stride(-1) == 1)
    return q, k, v, dout


# ----------------------------------------------------------------------------------------------
# Comparisons
# ----------------------------------------------------------------------------------------------

def _as64(x):
    return x.detach().cpu().to(torch.float64)


def rel_l2(got, ref):
    got, ref = _as64(got), _as64(ref)
    return ((got - ref).norm() / ref.norm()).item()


@contextlib.contextmanager
def no_host_sync():
    """Inside, any synchronization of the host with the CUDA device raises (torch's sync debug mode);
    warm the call up first, lazy initialization may synchronize."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def assert_close(name, got, ref, tol, natural=None):
    """Relative L2 error ||got - ref|| / ||ref|| <= tol, all values finite.
    `natural` (optional): the norm the tensor would have in a non-degenerate case. When the float64
    reference is zero up to rounding (||ref|| < 1e-6 * natural: e.g. dq and dk when every query sees
    exactly one key), a relative error is undefined and the check becomes ||got|| <= tol * natural."""
    got64, ref64 = _as64(got), _as64(ref)
    assert tuple(got.shape) == tuple(ref.shape), f"{name}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(got64).all(), f"{name}: {int((~torch.isfinite(got64)).sum())} non-finite values"
    ref_norm = ref64.norm().item()
    if natural is not None and ref_norm < 1e-6 * natural:
        err = got64.norm().item() / natural
        assert err <= tol, f"{name}: reference is zero, ||got|| / natural = {err:.3e} > {tol:.1e}"
        return
    if ref_norm == 0.0:
        assert torch.equal(got64, ref64), f"{name}: reference is exactly zero, got nonzero values"
        return
    err = (got64 - ref64).norm().item() / ref_norm
    assert err <= tol, f"{name}: relative L2 error {err:.3e} > {tol:.1e}"


def assert_lse_close(got, ref, tol):
    """lse: -inf exactly where the reference is -inf (rows without keys), never NaN/+inf; on the
    other rows an L2 error relative to max(||ref||, sqrt(n)), i.e. an RMS absolute error of tol
    when |lse| < 1 (lse errors are relative errors of the softmax normalizer, so absolute)."""
    got64, ref64 = _as64(got), _as64(ref)
    assert tuple(got.shape) == tuple(ref.shape), f"lse: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    assert not torch.isnan(got64).any(), "lse: NaN"
    assert not (got64 == math.inf).any(), "lse: +inf"
    empty_ref = ref64 == -math.inf
    empty_got = got64 == -math.inf
    assert torch.equal(empty_got, empty_ref), (
        f"lse: -inf at {int(empty_got.sum())} rows, expected at {int(empty_ref.sum())} rows without keys")
    fin = ~empty_ref
    if fin.any():
        denom = max(ref64[fin].norm().item(), math.sqrt(int(fin.sum())))
        err = (got64[fin] - ref64[fin]).norm().item() / denom
        assert err <= tol, f"lse: relative L2 error {err:.3e} > {tol:.1e}"


def expected_lse_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def natural_grad_norms(q, k, v, dout, scale):
    """Norms dq, dk, dv would have in a non-degenerate case (see assert_close):
    scale * ||dout|| * rms_row(v) * rms_row(k or q)."""
    q64, k64, v64, do64 = (_as64(t) for t in (q, k, v, dout))
    if scale is None:
        scale = 1.0 / math.sqrt(q64.shape[-1])

    def rms_row(t):
        return math.sqrt((t.norm().item() ** 2) / max(1, t.numel() // max(1, t.shape[-1])))

    dq_nat = scale * do64.norm().item() * rms_row(v64) * rms_row(k64)
    dk_nat = scale * do64.norm().item() * rms_row(v64) * rms_row(q64)
    dv_nat = do64.norm().item()
    return dq_nat, dk_nat, dv_nat


# ----------------------------------------------------------------------------------------------
# Variants: window, softcap, ALiBi, sinks, attn_mask, dropout
# ----------------------------------------------------------------------------------------------

MASK_KINDS = (None, "bool", "add")
MASK_PATTERNS = (
    "random",   # each entry visible with probability 3/4; one query row (or one key-padding entry) hidden
    "blocks",   # per MASK_BLOCK x MASK_BLOCK block: empty, plain (True / 0) or random
    "tiles",    # the same per MASK_TILE x MASK_TILE region: whole kernel tiles empty or plain
)
MASK_BLOCK = 16  # FLASH_MASK_BLOCK of csrc/constants.h: the granularity of the binding's block flags
MASK_TILE = 128  # a multiple of the kernels' query and key tiles (CPU 128 x 64; CUDA 64-128)
DIM_LETTERS = "bhqk"  # (B, H, Sq, Sk)


@dataclasses.dataclass(frozen=True)
class Var:
    """The variants of one call, on top of a Cfg (which holds shape, causal, scale and layout).

    window: flash_attn_func's (left, right), -1 unbounded. softcap: 0 off. alibi: None, "h" (slopes
    (H,)) or "bh" ((B, H)). sink: one learnable logit per query head. mask: None, "bool" or "add"
    (floating, q's dtype, requires grad). mask_dims: the attn_mask's dimensions right-aligned to
    (B, H, Sq, Sk): the letter of a dimension at full size, "1" for a broadcast one of size 1 (e.g.
    "qk": (Sq, Sk); "b11k": key padding). mask_pattern: one of MASK_PATTERNS. dropout: dropout_p."""
    window: tuple = (-1, -1)
    softcap: float = 0.0
    alibi: str = None
    sink: bool = False
    mask: str = None
    mask_dims: str = "bhqk"
    mask_pattern: str = "random"
    dropout: float = 0.0

    def __post_init__(self):
        assert self.alibi in (None, "h", "bh") and self.mask in MASK_KINDS and self.mask_pattern in MASK_PATTERNS
        dims = self.mask_dims
        assert 1 <= len(dims) <= 4 and dims[-1] == "k", dims
        assert all(c in ("1", DIM_LETTERS[4 - len(dims) + i]) for i, c in enumerate(dims)), dims
        assert self.mask_pattern == "random" or "q" in dims
        assert 0.0 <= self.dropout <= 1.0 and len(self.window) == 2

    @property
    def id(self):
        parts = []
        if tuple(self.window) != (-1, -1):
            parts.append(f"win{self.window[0]}_{self.window[1]}")
        if self.softcap:
            parts.append(f"softcap{self.softcap:g}")
        if self.alibi:
            parts.append(f"alibi_{self.alibi}")
        if self.sink:
            parts.append("sink")
        if self.mask:
            parts.append(f"mask_{self.mask}_{self.mask_dims}" + ("" if self.mask_pattern == "random" else
                                                                 f"_{self.mask_pattern}"))
        if self.dropout:
            parts.append(f"drop{self.dropout:g}")
        return "-".join(parts) or "dense"

    @property
    def sdpa_ok(self):
        """scaled_dot_product_attention takes attn_mask and dropout_p only (and attn_mask not with is_causal)."""
        return tuple(self.window) == (-1, -1) and not self.softcap and self.alibi is None and not self.sink


def mask_shape(cfg, dims):
    full = dict(zip(DIM_LETTERS, (cfg.b, cfg.h, cfg.sq, cfg.sk)))
    return tuple(1 if c == "1" else full[c] for c in dims)


def mask_visibility(shape, dims, pattern, gen):
    """(visible, plain): bool patterns of an attn_mask of `shape`: True = takes part; `plain` marks the
    entries of "blocks"' plain blocks (an additive mask is exactly 0 there)."""
    sq = shape[dims.index("q")] if "q" in dims else 1
    sk = shape[-1]
    plain = torch.zeros(shape, dtype=torch.bool)
    if pattern in ("blocks", "tiles"):
        n = MASK_BLOCK if pattern == "blocks" else MASK_TILE
        nbq, nbk = -(-sq // n), -(-sk // n)
        kind = torch.randint(0, 5, shape[:-2] + (nbq, nbk), generator=gen)  # 0, 1: empty; 2, 3: plain; 4: random
        kind = kind.repeat_interleave(n, -2)[..., :sq, :].repeat_interleave(n, -1)[..., :sk]
        rnd = torch.rand(shape, generator=gen) < 0.75
        plain = (kind >= 2) & (kind < 4)
        return torch.where(kind >= 4, rnd, plain), plain
    if "q" in dims:
        vis = torch.rand(shape, generator=gen) < 0.75
        if sq > 1:  # a query row that sees no key
            vis.select(dims.index("q"), 1).fill_(False)
        return vis, plain
    # key padding: a visible prefix of keys per entry of the other dimensions, lengths 0 .. sk (the
    # first entry unpadded, the last fully padded when there are at least three)
    lengths = torch.randint(0, sk + 1, shape[:-1], generator=gen).flatten()
    if lengths.numel() >= 2:
        lengths[0] = sk
    if lengths.numel() >= 3:
        lengths[-1] = 0
    return torch.arange(sk) < lengths.view(shape[:-1] + (1,)), plain


def make_variant_tensors(cfg, var, dtype, device, requires_grad=True, seed=None):
    """The tensors of var for cfg: {"alibi_slopes", "sink", "attn_mask"} (None where off).
    alibi_slopes fp32 in [0.05, 0.6); sink in [-1, 3) in the lse dtype (fp64 for fp64 inputs, else
    fp32), requiring grad; attn_mask bool, or floating in q's dtype (N(0, 1) values, -inf where
    hidden), requiring grad."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{cfg.id}|{var.id}".encode()) if seed is None else seed)
    t = {"alibi_slopes": None, "sink": None, "attn_mask": None}
    if var.alibi:
        shape = (cfg.h,) if var.alibi == "h" else (cfg.b, cfg.h)
        t["alibi_slopes"] = (0.05 + 0.55 * torch.rand(shape, generator=gen)).to(device)
    if var.sink:
        sink_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        sink = -1.0 + 4.0 * torch.rand(cfg.h, generator=gen, dtype=torch.float64)
        t["sink"] = sink.to(device=device, dtype=sink_dtype).requires_grad_(requires_grad)
    if var.mask:
        shape = mask_shape(cfg, var.mask_dims)
        vis, plain = mask_visibility(shape, var.mask_dims, var.mask_pattern, gen)
        if var.mask == "bool":
            t["attn_mask"] = vis.to(device)
        else:
            vals = torch.randn(shape, generator=gen, dtype=torch.float64)
            vals = vals.masked_fill(plain, 0.0).masked_fill(~vis, -math.inf)
            t["attn_mask"] = vals.to(device=device, dtype=dtype).requires_grad_(requires_grad)
    return t


def variant_grad_inputs(q, k, v, tensors):
    """The tensors whose gradients the tests compare: q, k, v, then the sink and a floating mask."""
    extra = [t for name, t in tensors.items() if name in ("sink", "attn_mask") and t is not None and t.requires_grad]
    return [q, k, v] + extra


def variant_grad_names(tensors):
    """The names of the gradients of variant_grad_inputs: dq, dk, dv, then dsink and dmask."""
    names = ["dq", "dk", "dv"]
    if tensors.get("sink") is not None and tensors["sink"].requires_grad:
        names.append("dsink")
    m = tensors.get("attn_mask")
    if m is not None and m.dtype != torch.bool and m.requires_grad:
        names.append("dmask")
    return names


def variant_reference(q, k, v, dout, cfg, var, tensors, keep=None, bottom_right=True):
    """float64 CPU results of attention64 for (cfg, var): {"out", "lse"} and, with dout, "dq", "dk", "dv",
    "dsink" (with a sink), "dmask" (floating mask: the gradient of the mask as given, summed over its
    broadcast dimensions), and for each gradient g an error scale g + "_rw" (see below).

    Every gradient is a sum of terms (dq_i = scale sum_j dS'_ij k_j, dk_j = scale sum_i dS'_ij q_i,
    dv_j = sum_i P~_ij dO_i, d mask = sum over broadcast dims of dS, d sink = -sum_i P_sink,i delta_i),
    and a kernel's rounding errors are relative to the size of those terms, not of their sum, which may
    cancel (rows that see one key have dS = 0 exactly: dP = delta). *_rw is the root sum of squares of
    the terms' sizes, with dS_ij = P_ij (dP~_ij - delta_i) sized P_ij (|dP~_ij - delta_i| + |delta_i|)
    (the operands of the difference every FlashAttention backward forms, delta = dO . O) and delta_i
    sized sum_d |dO_id O_id| (O is rounded to the dtype before that dot product, which may cancel);
    dP~ = dO V^T with dropout's keep / (1 - p_q), dS' = dS * the softcap factor.
    assert_sum_close judges the error relative to max(||g||, RW_FRACTION * ||g_rw||): the plain
    relative error except where the sum cancels."""
    with reference_threads(q, k):
        return _variant_reference(q, k, v, dout, cfg, var, tensors, keep, bottom_right)


def _variant_reference(q, k, v, dout, cfg, var, tensors, keep, bottom_right):
    leaves = [t.detach().cpu().to(torch.float64).requires_grad_() for t in (q, k, v)]
    B, Sq, H = q.shape[:3]
    Sk, Hkv = k.shape[1], k.shape[2]
    sink = tensors.get("sink")
    sink64 = sink.detach().cpu().to(torch.float64).requires_grad_() if sink is not None else None
    mask = tensors.get("attn_mask")
    mask_ref = None
    if mask is not None:
        if mask.dtype == torch.bool:
            mask_ref = mask.cpu()
        else:  # a full-size leaf: its gradient is the per-element dS
            mask_ref = mask.detach().cpu().to(torch.float64).expand(B, H, Sq, Sk).clone().requires_grad_()
    slopes = tensors.get("alibi_slopes")
    keep = None if keep is None else keep.cpu()
    out, lse, p, dcap = attention64(*leaves, cfg.scale, cfg.causal, bottom_right, window=tuple(var.window),
                                    softcap=var.softcap, alibi_slopes=None if slopes is None else slopes.cpu(),
                                    sink=sink64, attn_mask=mask_ref, dropout_p=var.dropout, keep=keep, internals=True)
    res = {"out": out.detach(), "lse": lse.detach()}
    if dout is None:
        return res
    do64 = dout.detach().cpu().to(torch.float64)
    inputs = leaves + ([sink64] if sink64 is not None else []) + (
        [mask_ref] if mask_ref is not None and mask_ref.requires_grad else [])
    grads = torch.autograd.grad(out, inputs, do64)
    res["dq"], res["dk"], res["dv"] = grads[:3]

    # error scales
    q64, k64, v64 = (t.detach() for t in leaves)
    o64 = out.detach()
    scale = default_scale(cfg)
    group = H // Hkv
    kv_head = torch.arange(H) // group
    drop = torch.ones(()) if keep is None else keep.to(torch.float64) * dropout_scale(var.dropout)
    dp = torch.einsum("bqhd,bkhd->bhqk", do64, v64.index_select(2, kv_head)) * drop           # dP~
    delta = (do64 * o64).sum(-1).transpose(1, 2)[..., None]                                     # (B, H, Sq, 1)
    don2 = do64.pow(2).sum(-1).transpose(1, 2)
    delta_size = (do64 * o64).abs().sum(-1).transpose(1, 2)[..., None]                         # sum |dO O|
    ds_size = p * ((dp - delta).abs() + delta_size)
    dsc2 = (ds_size * dcap) ** 2
    qn2 = q64.pow(2).sum(-1).transpose(1, 2)                                                    # (B, H, Sq)
    kn2 = k64.pow(2).sum(-1).index_select(2, kv_head).transpose(1, 2)                           # (B, H, Sk)

    def per_kv(x):  # (B, H, Sk) summed over the query heads of each kv head -> (B, Sk, Hkv)
        return x.view(B, Hkv, group, Sk).sum(2).transpose(1, 2)

    res["dq_rw"] = scale * (dsc2 * kn2[:, :, None, :]).sum(-1).sqrt().transpose(1, 2)         # (B, Sq, H)
    res["dk_rw"] = scale * per_kv((dsc2 * qn2[..., None]).sum(2)).sqrt()                       # (B, Sk, Hkv)
    res["dv_rw"] = per_kv(((p * drop) ** 2 * don2[..., None]).sum(2)).sqrt()
    if sink64 is not None:
        res["dsink"] = grads[3]
        p_sink = torch.exp(sink64.detach()[None, :, None] - lse.detach())                    # (B, H, Sq)
        res["dsink_rw"] = (p_sink * delta_size[..., 0]).pow(2).sum((0, 2)).sqrt()
    if mask_ref is not None and mask_ref.requires_grad:
        res["dmask"] = grads[-1].sum_to_size(mask.shape)
        res["dmask_rw"] = ds_size.pow(2).sum_to_size(mask.shape).sqrt()
    return res


def default_scale(cfg):
    return cfg.scale if cfg.scale is not None else (1.0 / math.sqrt(cfg.d) if cfg.d > 0 else 1.0)


def op_fwd_args(q, k, v, cfg, var, tensors, bottom_right=True, deterministic=False):
    """Positional arguments of torch.ops.flashattn_ext.fwd for (cfg, var); attn_mask as the
    (B, H, Sq, Sk) expanded view the public functions pass."""
    mask = tensors.get("attn_mask")
    if mask is not None:
        mask = mask.expand(cfg.b, cfg.h, cfg.sq, cfg.sk)
    return (q, k, v, default_scale(cfg), cfg.causal, bottom_right, int(var.window[0]), int(var.window[1]),
            float(var.softcap), tensors.get("alibi_slopes"), tensors.get("sink"), mask, float(var.dropout),
            deterministic)


def op_bwd_args(dout, q, k, v, out, lse, rng_state, cfg, var, tensors, bottom_right=True, deterministic=False,
                mask_grad=None):
    """Positional arguments of torch.ops.flashattn_ext.bwd matching op_fwd_args."""
    fwd = op_fwd_args(q, k, v, cfg, var, tensors, bottom_right, deterministic)
    mask = tensors.get("attn_mask")
    if mask_grad is None:
        mask_grad = mask is not None and mask.dtype != torch.bool and mask.requires_grad
    return (dout, q, k, v, out, lse, rng_state) + fwd[3:] + (bool(mask_grad),)


def run_flash(q, k, v, cfg, var, tensors, **kw):
    """flashattn_ext.flash_attn_func with every variant of var; returns (out, lse) (more with kw)."""
    import flashattn_ext
    return flashattn_ext.flash_attn_func(
        q, k, v, dropout_p=var.dropout, softmax_scale=cfg.scale, causal=cfg.causal, window_size=tuple(var.window),
        softcap=var.softcap, alibi_slopes=tensors.get("alibi_slopes"), return_lse=True, sink=tensors.get("sink"),
        attn_mask=tensors.get("attn_mask"), **kw)


def run_sdpa(q, k, v, cfg, var, tensors):
    """flashattn_ext.scaled_dot_product_attention on (B, S, H, D) tensors (transposed to torch's
    (B, H, S, D) and back); var must be sdpa_ok. is_causal is top-left aligned."""
    import flashattn_ext
    assert var.sdpa_ok
    out = flashattn_ext.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=tensors.get("attn_mask"),
        dropout_p=var.dropout, is_causal=cfg.causal, scale=cfg.scale, enable_gqa=cfg.h != cfg.hkv)
    return out.transpose(1, 2)


def replay_keep_mask(q, k, v, cfg, var, tensors, seed, bottom_right=True):
    """The dropout keep mask (B, H, Sq, Sk) of a public call made right after torch.manual_seed(seed):
    the same seeding, the fwd op (which draws the Philox seed and offset from torch's default
    generator) and torch.ops.flashattn_ext.dropout_mask of the rng_state it returns."""
    torch.manual_seed(seed)
    args = op_fwd_args(*(t.detach() for t in (q, k, v)), cfg, var,
                       {n: (t.detach() if t is not None else None) for n, t in tensors.items()}, bottom_right)
    with torch.no_grad():
        _, _, rng_state, _ = torch.ops.flashattn_ext.fwd(*args)
    return torch.ops.flashattn_ext.dropout_mask(q.detach(), rng_state, k.shape[1], var.dropout)


# Where a gradient's sum cancels, its error is judged against this fraction of the size of its terms
# (assert_sum_close). Without cancellation ||g_rw|| is 1-3 ||g|| for dq, dk, dv and d mask (the operands
# of dP - delta exceed their difference), so there the bound is the plain relative error; on rows that
# see one key (dS = 0 exactly) ||g_rw|| / ||g|| reaches 50 and more.
RW_FRACTION = 0.25


def assert_sum_close(name, got, ref, rw, tol):
    """A gradient that is a sum of terms (see variant_reference): relative L2 error against
    max(||ref||, RW_FRACTION * ||rw||), rw being the root sum of squares of the terms' sizes."""
    got64, ref64, rw64 = _as64(got), _as64(ref), _as64(rw)
    assert tuple(got.shape) == tuple(ref.shape), f"{name}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(got64).all(), f"{name}: {int((~torch.isfinite(got64)).sum())} non-finite values"
    denom = max(ref64.norm().item(), RW_FRACTION * rw64.norm().item())
    if denom == 0.0:
        assert (got64 == 0).all(), f"{name}: reference is exactly zero, got nonzero values"
        return
    err = (got64 - ref64).norm().item() / denom
    assert err <= tol, (f"{name}: relative L2 error {err:.3e} > {tol:.1e} (||ref|| {ref64.norm().item():.3e}, "
                        f"||terms|| {rw64.norm().item():.3e})")


def check_variant_results(got, ref, dtype, grad_tol_factor=1.0):
    """got: {"out", "lse"?, "dq", "dk", "dv", "dsink"?, "dmask"?} against variant_reference's dict: out and
    lse at the dtype's threshold, each gradient by assert_sum_close with its error scale."""
    assert_close("out", got["out"], ref["out"], OUT_TOL[dtype])
    if got.get("lse") is not None:
        assert_lse_close(got["lse"], ref["lse"], OUT_TOL[dtype])
    if "dq" not in got:
        return
    tol = grad_tol(dtype) * grad_tol_factor
    for name in ("dq", "dk", "dv", "dsink", "dmask"):
        if name in ref:
            assert got.get(name) is not None, f"{name}: no gradient returned"
            assert_sum_close(name, got[name], ref[name], ref[name + "_rw"], tol)


# Philox4x32-10 (Salmon et al., SC'11), the generator of dropout (csrc/mask.h): an independent numpy
# version of the stream mask.h documents, to check the keep masks bit for bit on every device.
PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
PHILOX_ROUNDS = 10
U32 = 0xFFFFFFFF
DROPOUT_KEYS_PER_CALL = 4  # 4 x 32 random bits = the 32-bit draws of 4 keys


def philox4x32_10(ctr, key):
    """ctr: 4 arrays of uint32 values, key: 2; returns the 4 output words (numpy uint64 arrays < 2^32)."""
    import numpy as np
    c = [np.asarray(x, dtype=np.uint64) for x in ctr]
    k0, k1 = (np.asarray(x, dtype=np.uint64) for x in key)
    m0, m1 = np.uint64(PHILOX_M[0]), np.uint64(PHILOX_M[1])
    u32, sh = np.uint64(U32), np.uint64(32)
    for _ in range(PHILOX_ROUNDS):
        p0, p1 = m0 * c[0], m1 * c[2]  # exact: 32 x 32 -> 64 bits
        c = [(p1 >> sh) ^ c[1] ^ k0, p1 & u32, (p0 >> sh) ^ c[3] ^ k1, p0 & u32]
        k0 = (k0 + np.uint64(PHILOX_W[0])) & u32
        k1 = (k1 + np.uint64(PHILOX_W[1])) & u32
    return c


def philox_keep_mask(seed, offset, batch, nheads, seqlen_q, seqlen_k, dropout_p):
    """(B, H, Sq, Sk) bool keep mask by mask.h's stream: the 32-bit draw of key j in row i of
    (b, h) is word j % 4 of Philox of counter (j // 4, i, b * H + h, offset low word), key (seed low
    word, seed high word ^ offset high word); kept iff the draw is >= dropout_threshold(p)."""
    import numpy as np
    threshold = dropout_threshold(dropout_p)
    bh = np.arange(batch * nheads, dtype=np.uint64)[:, None, None]
    i = np.arange(seqlen_q, dtype=np.uint64)[None, :, None]
    j = np.arange(seqlen_k, dtype=np.uint64)
    c = (j // DROPOUT_KEYS_PER_CALL)[None, None, :]
    seed, offset = int(seed) & ((1 << 64) - 1), int(offset) & ((1 << 64) - 1)
    zero = np.zeros((1, 1, 1), dtype=np.uint64)
    words = philox4x32_10((c + zero, i + zero, bh + zero, zero + (offset & U32)),
                          (seed & U32, (seed >> 32) ^ (offset >> 32)))
    words = np.stack(np.broadcast_arrays(*words))  # (4, BH, Sq, Sk)
    draw = words[j % DROPOUT_KEYS_PER_CALL, :, :, np.arange(seqlen_k)]  # (Sk, BH, Sq)
    keep = np.transpose(draw >= threshold, (1, 2, 0)).reshape(batch, nheads, seqlen_q, seqlen_k)
    return torch.from_numpy(np.ascontiguousarray(keep))


# ----------------------------------------------------------------------------------------------
# Child processes
# ----------------------------------------------------------------------------------------------

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(args, env_extra=None, timeout=900):
    """`python args...` in a fresh interpreter at the repo root, which is put on PYTHONPATH (so the
    in-place build is found), with env_extra added to the environment (e.g. variables read once per
    process)."""
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env_extra or {}))
    return subprocess.run([sys.executable, *args], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout)


# ----------------------------------------------------------------------------------------------
# The argument orders of the calls of the two attention ops (csrc/ops.cpp fwd / bwd) that the tests make with a
# variable-length batch or a KV cache, as positional tuples: each *_op below passes them to the op by name.
# ----------------------------------------------------------------------------------------------
VARLEN_FWD_ARGS = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "seqused_k", "max_seqlen_q", "max_seqlen_k",
                   "softmax_scale", "causal", "window_left", "window_right", "softcap", "alibi_slopes", "sink",
                   "dropout_p", "deterministic", "block_table", "rel_bias", "rel_buckets")
VARLEN_BWD_ARGS = ("dout", "q", "k", "v", "out", "lse", "rng_state", "cu_seqlens_q", "cu_seqlens_k", "seqused_k",
                   "max_seqlen_q", "max_seqlen_k", "softmax_scale", "causal", "window_left", "window_right", "softcap",
                   "alibi_slopes", "sink", "dropout_p", "deterministic", "rel_bias", "rel_buckets", "rel_bias_grad")
KVCACHE_FWD_ARGS = ("q", "k", "v", "cache_seqlens", "cache_batch_idx", "cache_leftpad", "block_table",
                    "softmax_scale", "causal", "window_left", "window_right", "softcap", "alibi_slopes", "sink",
                    "num_splits")


def op_kwargs(names, args):
    """{argument name: value} of positional args in the order names."""
    assert len(args) <= len(names)
    return dict(zip(names, args))


def varlen_fwd_op(*args):
    """flashattn_ext::fwd on a varlen batch -> (out, lse, rng_state, out32)."""
    return torch.ops.flashattn_ext.fwd(**op_kwargs(VARLEN_FWD_ARGS, args))


def varlen_bwd_op(*args):
    """flashattn_ext::bwd on a varlen batch -> (dq, dk, dv, drel_bias)."""
    dq, dk, dv, _, drel = torch.ops.flashattn_ext.bwd(**op_kwargs(VARLEN_BWD_ARGS, args))
    return dq, dk, dv, drel


def kvcache_fwd_op(*args):
    """flashattn_ext::fwd over a KV cache -> (out, lse)."""
    return torch.ops.flashattn_ext.fwd(**op_kwargs(KVCACHE_FWD_ARGS, args))[:2]


def opcheck_call(names, args):
    """torch.library.opcheck of the fwd (or, for VARLEN_BWD_ARGS, bwd) call of args in the order names."""
    op = torch.ops.flashattn_ext.bwd if names is VARLEN_BWD_ARGS else torch.ops.flashattn_ext.fwd
    torch.library.opcheck(op.default, (), op_kwargs(names, args))
