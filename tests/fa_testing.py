"""Shared helpers of the flashattn_ext tests.

* `attention64`: an independent eager float64 reference (scores, mask, softmax, @ v) written here,
  not imported from the library, so that flashattn_ext.reference.attention_ref is tested too.
* `SAMPLES`: the one list of configurations feeding correctness, gradient, opcheck and compile tests.
* `make_inputs`: builds q, k, v (and dout) for a configuration, in one of several memory layouts.
* tolerances and comparison helpers (relative L2 error against the float64 reference).
"""
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
DEVICE_DTYPES = [("cpu", torch.float32), ("cpu", torch.float64)] + [
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


def attention64(q, k, v, scale=None, causal=False, bottom_right=True):
    """Eager float64 attention. q: (B, Sq, H, D); k, v: (B, Sk, Hkv, D), H a multiple of Hkv (query
    head h uses kv head h // (H / Hkv)). Returns out (B, Sq, H, D) and lse (B, H, Sq), float64.
    Rows that see no key give out = 0, lse = -inf, and no NaN in any gradient (the where() calls
    keep -inf - -inf out of both the forward and the backward graph)."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    group = H // Hkv
    qh = q.transpose(1, 2)                                          # (B, H, Sq, D)
    kh = k.transpose(1, 2).repeat_interleave(group, dim=1)          # (B, H, Sk, D)
    vh = v.transpose(1, 2).repeat_interleave(group, dim=1)          # (B, H, Sk, D)
    s = (qh @ kh.transpose(-1, -2)) * scale                         # (B, H, Sq, Sk)
    if causal:
        mask = causal_mask(Sq, Sk, bottom_right, q.device)
    else:
        mask = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
    row_empty = ~mask.any(-1, keepdim=True)                         # (Sq, 1)
    neg_inf = torch.tensor(-math.inf, dtype=torch.float64, device=q.device)
    s_masked = torch.where(mask, s, neg_inf)
    lse = torch.logsumexp(s_masked.detach(), dim=-1)                # -inf on empty rows
    s_safe = torch.where(row_empty, torch.zeros((), dtype=torch.float64, device=q.device), s_masked)
    p = torch.softmax(s_safe, dim=-1)
    p = torch.where(mask & ~row_empty, p, torch.zeros((), dtype=torch.float64, device=q.device))
    out = (p @ vh).transpose(1, 2)                                  # (B, Sq, H, D)
    return out, lse


def reference_with_grads(q, k, v, dout, scale=None, causal=False, bottom_right=True):
    """float64 out, lse, dq, dk, dv (all on the CPU) for the given (any dtype/device) inputs."""
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

    def __post_init__(self):
        assert self.h % self.hkv == 0 and self.layout in LAYOUTS
        assert self.layout != "qkvpacked" or (self.sq == self.sk and self.h == self.hkv)

    @property
    def id(self):
        s = f"b{self.b}-q{self.sq}-k{self.sk}-h{self.h}/{self.hkv}-d{self.d}"
        if self.causal:
            s += "-causal"
        if self.scale is not None:
            s += f"-scale{self.scale:g}"
        if self.layout != "contig":
            s += f"-{self.layout}"
        return s

    @property
    def seed(self):
        return zlib.crc32(self.id.encode())

    def supports(self, device, dtype):
        """CUDA fp16/bf16 kernels take head dims that are multiples of 8, up to 256."""
        return dtype not in HALF_DTYPES or (self.d % 8 == 0 and self.d <= 256)


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
    """q (B, Sq, H, D), k, v (B, Sk, Hkv, D), dout (B, Sq, H, D) in cfg.layout.
    With requires_grad, q/k/v are views of leaf tensors that require grad (use torch.autograd.grad
    with respect to the views)."""
    gen = torch.Generator().manual_seed(cfg.seed if seed is None else seed)
    B, Sq, Sk, H, Hkv, D = cfg.b, cfg.sq, cfg.sk, cfg.h, cfg.hkv, cfg.d

    def rnd(*shape):
        t = torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)
        return t.requires_grad_(requires_grad)

    def contig(s, h):
        return rnd(B, s, h, D)

    def bhsd(s, h):
        return rnd(B, h, s, D).transpose(1, 2)

    def sliced(s, h):
        return rnd(B, s, h, D + 5)[..., 2:2 + D]

    layout = cfg.layout
    if layout == "contig":
        q, k, v = contig(Sq, H), contig(Sk, Hkv), contig(Sk, Hkv)
    elif layout == "bhsd":
        q, k, v = bhsd(Sq, H), bhsd(Sk, Hkv), bhsd(Sk, Hkv)
    elif layout == "slice":
        q, k, v = sliced(Sq, H), sliced(Sk, Hkv), sliced(Sk, Hkv)
    elif layout == "kvpacked":
        q = sliced(Sq, H)
        kv = rnd(B, Sk, 2, Hkv, D)
        k, v = kv[:, :, 0], kv[:, :, 1]
    elif layout == "qkvpacked":
        q, k, v = rnd(B, Sq, 3, H, D).unbind(2)
    elif layout == "mixed":
        q, k, v = bhsd(Sq, H), contig(Sk, Hkv), sliced(Sk, Hkv)
    elif layout == "bcast":
        q = contig(Sq, H)
        k, v = (rnd(1, Sk, 1, D).expand(B, Sk, Hkv, D) for _ in range(2))
    else:
        raise AssertionError(layout)
    dout = torch.randn(B, Sq, H, D, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)
    if layout == "mixed":
        dout = dout.transpose(1, 2).contiguous().transpose(1, 2)
    elif layout == "slice":  # last-dim stride 2: the backward has to cope (autograd hands it over as is)
        dout = torch.stack([dout, torch.zeros_like(dout)], -1).flatten(-2)[..., ::2]
    for t in (q, k, v):
        assert t.shape[-1] == D and (t.numel() == 0 or t.stride(-1) == 1)
    return q, k, v, dout


# ----------------------------------------------------------------------------------------------
# Comparisons
# ----------------------------------------------------------------------------------------------

def _as64(x):
    return x.detach().cpu().to(torch.float64)


def rel_l2(got, ref):
    got, ref = _as64(got), _as64(ref)
    return ((got - ref).norm() / ref.norm()).item()


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
    D = q64.shape[-1]
    if scale is None:
        scale = 1.0 / math.sqrt(D)

    def rms_row(t):
        return math.sqrt((t.norm().item() ** 2) / max(1, t.numel() // D))

    dq_nat = scale * do64.norm().item() * rms_row(v64) * rms_row(k64)
    dk_nat = scale * do64.norm().item() * rms_row(v64) * rms_row(q64)
    dv_nat = do64.norm().item()
    return dq_nat, dk_nat, dv_nat


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
