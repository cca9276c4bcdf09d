"""Fuzz tests: random shapes (batch, seqlens, nheads / nheads_kv, head dims 1-256 and in some cases up to 512, v's head
dim its own in some cases), memory layouts per tensor (contiguous, (B, H, S, D) transposed, sliced with padding,
padded rows, broadcast k/v), variants and their combinations, through flash_attn_func (some of its cases with
deterministic=True) and scaled_dot_product_attention, forward and backward against the float64 reference of
fa_testing.py. The cases come from fixed seeds (40 on the CPU in fp32/fp64 and 30 in fp16/bf16, 200 on CUDA in every
dtype), so a failure is reproducible from its test id; the two shapes of issue 10's bug (fp16, head dim 1,
transposed inputs) are tested by name. Beside them: torch's SDPA contract, gradient penalties (double backward) and
random flash_attn_with_kvcache calls (append, decode path, paged / indexed caches) against their references."""
import dataclasses
import math
import random

import pytest
import torch

import flashattn_ext
from fa_testing import (
    assert_lse_close,
    attention64,
    DTYPE_NAMES,
    OUT_TOL,
    Cfg,
    Var,
    assert_close,
    check_variant_results,
    device_dtype_params,
    grad_tol,
    make_variant_tensors,
    natural_grad_norms,
    reference_with_grads,
    replay_keep_mask,
    requires_cuda,
    run_flash,
    run_sdpa,
    variant_grad_inputs,
    variant_grad_names,
    variant_reference,
)
from test_kvcache import CACHE_TOL
from test_kvcache import Case as KvCase
from test_kvcache import call as kv_call
from test_kvcache import make_inputs as make_kv_inputs
from test_kvcache import reference as kv_reference
from test_rel_bias import bias_matrix

from flashattn_ext.reference import attention_ref

CPU_SEEDS = range(40)
# fp16 / bf16 on the CPU: fp32 kernels on exact fp32 copies, their products on AMX tiles where the CPU has AMX
CPU_HALF_SEEDS = range(500, 530)
DETERMINISTIC_SEED_OFFSET = 7_000_003
HEADDIM_V_SEED_OFFSET = 9_000_011
LARGE_HEADDIM_SEED_OFFSET = 12_000_041
# the largest head dims drawn (q / k: up to 256, and 257..top in LARGE_HEADDIM_SHARE of the cases where top > 256; v's
# own up to top): fp16 / bf16 CUDA calls above 256 run the d512 tiles (the deterministic backward the fp32 kernels)
MAX_HEADDIM = {"cpu": 512, "cuda": 512, "cuda fp32 / fp64": 512}
LARGE_HEADDIM_SHARE = 0.1
CUDA_SEEDS = range(1000, 1200)
DROPOUT_SEED = 4321

# Work bounds per case (multiply-adds B * H * Sq * Sk * D, and elements of the (B, H, Sq, Sk) scores the
# float64 reference materializes): the CPU kernels and reference stay at milliseconds per case.
BUDGET = {"cpu": (1 << 22, 1 << 18), "cuda": (1 << 25, 1 << 21)}
MAX_SEQLEN = 400
SPECIAL_HEAD_DIMS = (1, 2, 3, 7, 8, 16, 24, 32, 40, 63, 64, 72, 80, 96, 100, 128, 160, 192, 200, 224, 255, 256)
TENSOR_LAYOUTS = (
    "contig",   # (B, S, H, D) contiguous
    "bhsd",     # a transposed (B, H, S, D) tensor
    "slice",    # [..., o:o + D] of (B, S, H, D + pad): odd strides, a storage offset (misaligned)
    "rows",     # [:, o:o + S] of (B, S + pad, H, D): padded rows, a storage offset
    "bcast",    # k / v only: expanded from (1, S, 1, D) (stride 0 on batch and heads)
)


@dataclasses.dataclass(frozen=True)
class Case:
    seed: int
    device: str
    dtype: torch.dtype
    cfg: Cfg
    var: Var
    layouts: tuple  # of q, k, v, dout
    api: str        # "flash" or "sdpa"
    deterministic: bool = False  # flash_attn_func's deterministic=True

    @property
    def id(self):
        return (f"{self.seed}-{self.device}-{DTYPE_NAMES[self.dtype]}-{self.api}-{self.cfg.id}-{self.var.id}-"
                + "/".join(self.layouts) + ("-det" if self.deterministic else ""))


def log_uniform_int(rng, lo, hi):
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def draw_case(seed, device, half=False):
    """The case of one seed: every choice drawn from random.Random(seed); half: a CPU case in fp16 / bf16."""
    rng = random.Random(seed)
    if device == "cpu":
        dtype = rng.choice((torch.float16, torch.bfloat16) if half else (torch.float32, torch.float64))
    else:
        dtype = rng.choices((torch.float16, torch.bfloat16, torch.float32, torch.float64), (3, 3, 1, 1))[0]
    d = rng.choice(SPECIAL_HEAD_DIMS) if rng.random() < 0.4 else rng.randint(1, 256)
    top = MAX_HEADDIM["cuda fp32 / fp64" if device == "cuda" and dtype.itemsize >= 4 else device]
    # head dims above 256 and v's own head dim (d_v != d_qk) from generators of their own, as deterministic below
    rng_d = random.Random(seed + LARGE_HEADDIM_SEED_OFFSET)
    if top > 256 and rng_d.random() < LARGE_HEADDIM_SHARE:
        d = rng_d.randint(257, top)
    rng_v = random.Random(seed + HEADDIM_V_SEED_OFFSET)
    dv = None
    if rng_v.random() < 0.3:
        dv = rng_v.choice(SPECIAL_HEAD_DIMS) if rng_v.random() < 0.4 else rng_v.randint(1, top)
    b = rng.randint(1, 3)
    hkv = rng.choice((1, 1, 2, 3))
    h = hkv * rng.choice((1, 2, 4))
    sq = 1 if rng.random() < 0.1 else log_uniform_int(rng, 1, MAX_SEQLEN)
    sk = 1 if rng.random() < 0.1 else log_uniform_int(rng, 1, MAX_SEQLEN)
    macs, elems = BUDGET[device]
    while b * h * sq * sk * d > macs or b * h * sq * sk > elems:  # on d alone: dv leaves every other choice as it was
        if b > 1:
            b -= 1
        elif sq >= sk:
            sq = max(1, sq // 2)
        else:
            sk = max(1, sk // 2)
    api = "sdpa" if rng.random() < 0.25 else "flash"
    causal = rng.random() < 0.4
    # scores of standard deviation <= 2.5: keeps the fp16/bf16 gradients within their tolerance
    scale = None if rng.random() < 0.5 else rng.uniform(0.1, 2.5) / math.sqrt(d)
    fields = {}
    if api == "flash":
        if rng.random() < 0.3:
            window = (-1, -1)
            while window == (-1, -1):
                window = tuple(-1 if rng.random() < 0.3 else rng.randint(0, max(sq, sk)) for _ in range(2))
            fields["window"] = window
        if rng.random() < 0.2:
            fields["softcap"] = round(rng.uniform(0.5, 30.0), 2)
        if rng.random() < 0.2:
            fields["alibi"] = rng.choice(("h", "bh"))
        if rng.random() < 0.25:
            fields["sink"] = True
    if rng.random() < 0.3 and not (api == "sdpa" and causal):
        fields["mask"] = rng.choice(("bool", "add"))
        fields["mask_dims"] = rng.choice(("bhqk", "b1qk", "1hqk", "qk", "hqk", "b11k", "1h1k", "k"))
        if "q" in fields["mask_dims"] and rng.random() < 0.4:
            fields["mask_pattern"] = "blocks"
    if rng.random() < 0.25:
        fields["dropout"] = round(rng.uniform(0.05, 0.6), 3)
    layouts = tuple(rng.choice(TENSOR_LAYOUTS[:4] if name in ("q", "dout") else TENSOR_LAYOUTS)
                    for name in ("q", "k", "v", "dout"))
    cfg = Cfg(b, sq, sk, h, hkv, d, causal=causal, scale=scale, dv=dv)
    # drawn from a generator of its own, so that the other choices of a seed stay what they were
    deterministic = api == "flash" and random.Random(seed + DETERMINISTIC_SEED_OFFSET).random() < 0.3
    return Case(seed, device, dtype, cfg, Var(**fields), layouts, api, deterministic)


def make_fuzz_inputs(case):
    """q, k, v (views of leaves that require grad) and dout, each in its own layout (v and dout with cfg.d_v
    columns)."""
    cfg, dtype, device = case.cfg, case.dtype, case.device
    gen = torch.Generator().manual_seed(case.seed)
    B = cfg.b

    def build(layout, s, h, requires_grad, D):
        if layout == "contig":
            t = torch.randn(B, s, h, D, generator=gen, dtype=torch.float64)
            leaf = t.to(device=device, dtype=dtype).requires_grad_(requires_grad)
            return leaf
        if layout == "bhsd":
            leaf = torch.randn(B, h, s, D, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
            return leaf.requires_grad_(requires_grad).transpose(1, 2)
        if layout == "slice":
            pad = int(torch.randint(1, 8, (1,), generator=gen))
            off = int(torch.randint(0, pad + 1, (1,), generator=gen))
            leaf = torch.randn(B, s, h, D + pad, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
            return leaf.requires_grad_(requires_grad)[..., off:off + D]
        if layout == "rows":
            pad = int(torch.randint(1, 5, (1,), generator=gen))
            off = int(torch.randint(0, pad + 1, (1,), generator=gen))
            leaf = torch.randn(B, s + pad, h, D, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
            return leaf.requires_grad_(requires_grad)[:, off:off + s]
        if layout == "bcast":
            leaf = torch.randn(1, s, 1, D, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
            return leaf.requires_grad_(requires_grad).expand(B, s, h, D)
        raise AssertionError(layout)

    lq, lk, lv, ldo = case.layouts
    q = build(lq, cfg.sq, cfg.h, True, cfg.d)
    k = build(lk, cfg.sk, cfg.hkv, True, cfg.d)
    v = build(lv, cfg.sk, cfg.hkv, True, cfg.d_v)
    dout = build(ldo, cfg.sq, cfg.h, False, cfg.d_v)
    return q, k, v, dout


def check_case(case):
    got, (q, k, v, dout, t) = run_case(case)
    bottom_right = case.api == "flash"
    keep = replay_keep_mask(q, k, v, case.cfg, case.var, t, DROPOUT_SEED, bottom_right) if case.var.dropout else None
    ref = variant_reference(q, k, v, dout, case.cfg, case.var, t, keep=keep, bottom_right=bottom_right)
    check_variant_results(got, ref, case.dtype)


def run_case(case):
    """out, lse and the gradients of one case (flash_attn_func or SDPA on its inputs), and those inputs (q, k, v,
    dout and the variant's tensors)."""
    cfg, var, dtype, device = case.cfg, case.var, case.dtype, case.device
    q, k, v, dout = make_fuzz_inputs(case)
    t = make_variant_tensors(cfg, var, dtype, device, seed=case.seed)
    torch.manual_seed(DROPOUT_SEED)
    if case.api == "flash":
        out, lse = run_flash(q, k, v, cfg, var, t, deterministic=case.deterministic)
    else:
        out, lse = run_sdpa(q, k, v, cfg, var, t), None
    got = dict(zip(variant_grad_names(t), torch.autograd.grad(out, variant_grad_inputs(q, k, v, t), dout)))
    got.update(out=out, lse=lse)
    return got, (q, k, v, dout, t)


def check_case_torch_func(case):
    """check_case with the gradients from torch.func.vjp (the ops' autograd in its torch.func form) instead of
    torch.autograd.grad; the variant's sink and floating mask among the differentiated inputs."""
    cfg, var, dtype, device = case.cfg, case.var, case.dtype, case.device
    q, k, v, dout = make_fuzz_inputs(case)
    t = make_variant_tensors(cfg, var, dtype, device, seed=case.seed)
    bottom_right = case.api == "flash"
    keep = replay_keep_mask(q, k, v, cfg, var, t, DROPOUT_SEED, bottom_right) if var.dropout else None
    extra = [n for n, x in t.items() if n in ("sink", "attn_mask") and x is not None and x.requires_grad]

    def f(q, k, v, *xs):
        tt = dict(t, **dict(zip(extra, xs)))
        torch.manual_seed(DROPOUT_SEED)
        if case.api == "flash":
            return run_flash(q, k, v, cfg, var, tt, deterministic=case.deterministic)[0]
        return run_sdpa(q, k, v, cfg, var, tt)

    out, vjp = torch.func.vjp(f, *(x.detach() for x in variant_grad_inputs(q, k, v, t)))
    got = dict(zip(variant_grad_names(t), vjp(dout)), out=out)
    check_variant_results(got, variant_reference(q, k, v, dout, cfg, var, t, keep=keep, bottom_right=bottom_right),
                          dtype)


CPU_CASES = [draw_case(s, "cpu") for s in CPU_SEEDS]
CPU_HALF_CASES = [draw_case(s, "cpu", half=True) for s in CPU_HALF_SEEDS]
CUDA_CASES = [draw_case(s, "cuda") for s in CUDA_SEEDS]


@pytest.mark.parametrize("case", CPU_CASES + CPU_HALF_CASES, ids=lambda c: c.id)
def test_fuzz_cpu(case):
    check_case(case)


AMX = flashattn_ext._core.LIMITS["cpu_amx"]
AMX_MODES = (["1"] if AMX else []) + (["dp"] if AMX == "tiles" and flashattn_ext._core.LIMITS["cpu_amx_dp"] else [])


@pytest.mark.skipif(not AMX, reason="no AMX-BF16 or AVX512-BF16 on this CPU")
@pytest.mark.parametrize("mode", AMX_MODES)
@pytest.mark.parametrize("case", CPU_HALF_CASES, ids=lambda c: c.id)
def test_fuzz_cpu_amx_as_the_fp32_kernels(case, mode, monkeypatch):
    """The fp16 / bf16 cases with their products on AMX tiles or (mode dp, or without tiles: bf16 forwards) on
    AVX512-BF16 dot products (csrc/cpu/amx.c: exact bf16 terms, the forward's softmax fused with P's packing,
    bf16's P in 16 bits) against the fp32 kernels on the same inputs (FLASHATTN_EXT_CPU_AMX=0): every element of
    out and of the gradients within two rounding steps of the inputs' dtype (of the larger of the value and 1% of
    the tensor's maximum), lse within 1e-5."""
    backend = "dp" if mode == "dp" else AMX
    if backend == "dp" and case.dtype != torch.bfloat16:
        pytest.skip("the dot products take the bf16 forward only")
    results = {}
    for m in ("0", mode):
        monkeypatch.setenv("FLASHATTN_EXT_CPU_AMX", m)
        results[m] = run_case(case)[0]
    eps = torch.finfo(case.dtype).eps
    for name, f in results["0"].items():
        a = results[mode][name]
        if f is None:
            assert a is None, name
            continue
        if name == "lse":
            finite = torch.isfinite(f)
            assert torch.equal(finite, torch.isfinite(a)) and torch.equal(f[~finite], a[~finite]), name
            lf, la = f[finite].double(), a[finite].double()
            assert ((la - lf).abs() <= 1e-5 * lf.abs().clamp_min(1)).all(), name
            continue
        assert a.dtype == f.dtype, name  # the dtype's; float32 for a sink's gradient
        ref = f.double()
        step = eps * ref.abs().clamp_min(ref.abs().max() * 1e-2)
        assert ((a.double() - ref).abs() <= 2 * step + 1e-6).all(), name


@requires_cuda
@pytest.mark.parametrize("case", CUDA_CASES, ids=lambda c: c.id)
def test_fuzz_cuda(case):
    check_case(case)


@pytest.mark.parametrize("case", CPU_CASES[:16], ids=lambda c: c.id)
def test_fuzz_torch_func_cpu(case):
    check_case_torch_func(case)


@requires_cuda
@pytest.mark.parametrize("case", CUDA_CASES[:24], ids=lambda c: c.id)
def test_fuzz_torch_func_cuda(case):
    check_case_torch_func(case)


def test_fuzz_cases_cover_the_axes():
    """The drawn cases span what they are meant to: head dims from 1 to 512, every layout, both APIs, every variant, lengths 1 and > 256, GQA."""
    for cases in (CPU_CASES, CUDA_CASES):
        dims = {c.cfg.d for c in cases}
        assert min(dims) <= 3 and max(dims) >= 200
        assert any(c.cfg.d > 256 for c in cases)
        assert any(c.cfg.d_v > c.cfg.d for c in cases) and any(c.cfg.d_v < c.cfg.d for c in cases)
        assert {lay for c in cases for lay in c.layouts} == set(TENSOR_LAYOUTS)
        assert {c.api for c in cases} == {"flash", "sdpa"}
        assert any(c.cfg.sq == 1 for c in cases) and any(max(c.cfg.sq, c.cfg.sk) > 256 for c in cases)
        assert any(c.cfg.h != c.cfg.hkv for c in cases) and any(c.cfg.causal for c in cases)
        assert any(c.deterministic for c in cases) and any(c.deterministic and c.var.id != Var().id for c in cases)
        for field in ("window", "softcap", "alibi", "sink", "mask", "dropout"):
            assert any(getattr(c.var, field) not in ((-1, -1), 0.0, None, False) for c in cases), field
        assert sum(len(c.var.id.split("-")) >= 2 for c in cases) >= len(cases) // 8  # combinations
    assert {c.dtype for c in CUDA_CASES} == {torch.float16, torch.bfloat16, torch.float32, torch.float64}
    assert {c.dtype for c in CPU_HALF_CASES} == {torch.float16, torch.bfloat16}


# ----------------------------------------------------------------------------------------------
# The shapes of issue 10's bug: fp16 backward, head dim 1, (B, H, S, D)-transposed inputs
# ----------------------------------------------------------------------------------------------

def check_plain(inputs, dout, out, scale, causal, bottom_right, dtype, layout_of_sdpa=False):
    """Gradients of out with respect to inputs (q, k, v) against the reference; with layout_of_sdpa the
    tensors are (B, H, S, D) and are compared as their (B, S, H, D) transposes."""
    grads = torch.autograd.grad(out, inputs, dout)
    if layout_of_sdpa:
        inputs, grads, dout, out = ([x.transpose(1, 2) for x in xs] for xs in (inputs, grads, [dout], [out]))
        dout, out = dout[0], out[0]
    q, k, v = inputs
    ref_out, _, *ref_grads = reference_with_grads(q, k, v, dout, scale, causal, bottom_right)
    assert_close("out", out, ref_out, OUT_TOL[dtype])
    for name, g, r, n in zip(("dq", "dk", "dv"), grads, ref_grads, natural_grad_norms(q, k, v, dout, scale)):
        assert_close(name, g, r, grad_tol(dtype), natural=n)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_issue_bug_flash_attn_func_head_dim_1(device, dtype, causal):
    """flash_attn_func on q (1, 1, 4, 1), k/v (1, 65, 4, 1), each the transpose of a (B, H, S, D) tensor."""
    g = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(1, 4, s, 1, generator=g, dtype=torch.float64).to(device, dtype).requires_grad_()
               for s in (1, 65, 65))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    assert qt.shape == (1, 1, 4, 1) and kt.shape == (1, 65, 4, 1)
    dout = torch.randn(1, 1, 4, 1, generator=g, dtype=torch.float64).to(device, dtype)
    out = flashattn_ext.flash_attn_func(qt, kt, vt, causal=causal)
    check_plain((qt, kt, vt), dout, out, None, causal, True, dtype)


@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_issue_bug_sdpa_head_dim_1(device, dtype):
    """scaled_dot_product_attention on q (1, 2, 1, 1), k/v (1, 2, 17, 1), is_causal=True, scale=0.5."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, s, 1, generator=g, dtype=torch.float64).to(device, dtype).requires_grad_()
               for s in (1, 17, 17))
    dout = torch.randn(1, 2, 1, 1, generator=g, dtype=torch.float64).to(device, dtype)
    out = flashattn_ext.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)
    assert out.shape == (1, 2, 1, 1)
    check_plain((q, k, v), dout, out, 0.5, True, False, dtype, layout_of_sdpa=True)


@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_issue_bug_shapes_with_variants(device, dtype):
    """The bug's shapes again with variants on: window, sink, softcap and dropout through flash_attn_func;
    an additive mask and dropout through SDPA (not causal: a mask excludes is_causal)."""
    cases = [
        (Cfg(1, 1, 65, 4, 4, 1, causal=True), Var(window=(30, -1), sink=True, softcap=5.0, dropout=0.2), "flash"),
        (Cfg(1, 1, 17, 2, 2, 1, scale=0.5), Var(mask="add", mask_dims="b1qk", dropout=0.2), "sdpa"),
    ]
    for cfg, var, api in cases:
        case = Case(0, device, dtype, cfg, var, ("bhsd", "bhsd", "bhsd", "bhsd"), api)
        check_case(case)


# ---- torch's SDPA contract: random ranks, broadcast batch dims and heads, strides, masks (CPU, float64) --------


def draw_sdpa_case(seed):
    """Shapes and layouts of one SDPA call as torch accepts it: query (*bq, h, sq, d), key / value (*bk, hk,
    sk, d / dv) with the batch dims broadcasting against each other (some of them 1), heads broadcast (hk 1)
    or grouped (enable_gqa), an optional bool / float mask of a broadcastable shape or is_causal."""
    rng = random.Random(seed)
    nbatch = rng.randint(0, 3)
    batch = [rng.randint(1, 3) for _ in range(nbatch)]
    bq = [1 if rng.random() < 0.3 else n for n in batch]
    bk = [1 if rng.random() < 0.3 else n for n in batch]
    gqa = rng.random() < 0.3
    hk = rng.choice((1, 2))
    h = hk * rng.choice((1, 2)) if gqa else rng.choice((hk, 1 if hk == 1 else hk))
    if not gqa and rng.random() < 0.3:
        hk, h = 1, rng.choice((1, 3))  # heads broadcast from 1
    sq, sk = rng.randint(1, 9), rng.randint(1, 9)
    d = rng.choice((1, 4, 8, 13))
    dv = d if rng.random() < 0.7 else rng.choice((2, 8, 16))
    causal = rng.random() < 0.3
    mask = None if causal or rng.random() < 0.4 else (rng.choice(("bool", "float")),
                                                     tuple(rng.choice((1, n)) for n in batch + [h, sq, sk]))
    strided = tuple(rng.random() < 0.3 for _ in range(3))  # last stride 2 (a copy is needed)
    transposed = tuple(rng.random() < 0.5 for _ in range(3))  # (..., s, h, d) storage
    scale = None if rng.random() < 0.5 else rng.uniform(0.2, 1.5)
    return dict(bq=bq, bk=bk, h=h, hk=hk, sq=sq, sk=sk, d=d, dv=dv, causal=causal, mask=mask, gqa=gqa,
                strided=strided, transposed=transposed, scale=scale)


def make_sdpa_tensor(gen, shape, strided, transposed):
    """A float64 leaf that requires grad and the view of `shape` built from it in the drawn layout."""
    *lead, hh, s, dd = shape
    full = [*lead, s, hh, dd * (2 if strided else 1)] if transposed else [*lead, hh, s, dd * (2 if strided else 1)]
    leaf = torch.randn(full, generator=gen, dtype=torch.float64).requires_grad_()
    x = leaf[..., ::2] if strided else leaf
    return leaf, (x.transpose(-3, -2) if transposed else x)


@pytest.mark.parametrize("seed", range(30))
def test_fuzz_sdpa_torch_contract(seed):
    c = draw_sdpa_case(seed)
    gen = torch.Generator().manual_seed(seed)
    leaves, views = [], []
    for i, shape in enumerate(([*c["bq"], c["h"], c["sq"], c["d"]], [*c["bk"], c["hk"], c["sk"], c["d"]],
                               [*c["bk"], c["hk"], c["sk"], c["dv"]])):
        leaf, view = make_sdpa_tensor(gen, shape, c["strided"][i], c["transposed"][i])
        leaves.append(leaf)
        views.append(view)
    mask = None
    if c["mask"] is not None:
        kind, shape = c["mask"]
        mask = (torch.rand(shape, generator=gen) > 0.3) if kind == "bool" else \
            torch.randn(shape, generator=gen, dtype=torch.float64).requires_grad_()
    kwargs = dict(attn_mask=mask, is_causal=c["causal"], scale=c["scale"], enable_gqa=c["gqa"])
    inputs = leaves + ([mask] if mask is not None and mask.requires_grad else [])
    out = flashattn_ext.scaled_dot_product_attention(*views, **kwargs)
    dout = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    ours = torch.autograd.grad(out, inputs, dout)
    ref_out = torch.nn.functional.scaled_dot_product_attention(*views, **kwargs)
    ref = torch.autograd.grad(ref_out, inputs, dout)
    assert out.shape == ref_out.shape
    # torch's math gives NaN on rows a bool mask hides entirely where ours (and its fused kernels) give 0
    hidden = ref_out.isnan()
    torch.testing.assert_close(out[~hidden], ref_out[~hidden], atol=1e-12, rtol=1e-10)
    for a, b in zip(ours, ref):
        if not b.isnan().any():
            torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9)


# ---- double backward: gradient penalties of random variant combinations against eager float64 (CPU) -----------


@pytest.mark.parametrize("seed", range(16))
def test_fuzz_double_backward(seed):
    """loss = <out, g> + ||dq||^2 + ||dk||^2 + ||dv||^2 (the first-order gradients taken with create_graph), then
    its gradients of q, k, v, the sink and a float mask: ours against eager float64 attention (attention64) to
    1e-9, over random shapes, GQA, both causal alignments, windows, softcap, ALiBi, sinks and masks."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    b, hkv = rng.randint(1, 2), rng.choice((1, 2))
    h, sq, sk, d = hkv * rng.choice((1, 2)), rng.randint(1, 11), rng.randint(1, 11), rng.choice((3, 8, 16))
    kw = dict(causal=rng.random() < 0.4)
    if rng.random() < 0.3:
        kw["window_size"] = (rng.randint(0, 6), rng.randint(0, 6))
    if rng.random() < 0.3:
        kw["softcap"] = rng.uniform(1.0, 8.0)
    if rng.random() < 0.3:
        kw["alibi_slopes"] = torch.rand(h, generator=gen, dtype=torch.float64).float()
    leaf = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()  # noqa: E731
    q, k, v = leaf(b, sq, h, d), leaf(b, sk, hkv, d), leaf(b, sk, hkv, d)
    extra = {}
    if rng.random() < 0.3:
        extra["sink"] = leaf(h)
    if rng.random() < 0.3:
        extra["attn_mask"] = leaf(b, h, sq, sk)
    g = torch.randn(b, sq, h, d, generator=gen, dtype=torch.float64)
    inputs = [q, k, v] + list(extra.values())

    def penalty(out):
        firsts = torch.autograd.grad((out * g).sum(), (q, k, v), create_graph=True)
        loss = (out * g).sum() + sum((f * f).sum() for f in firsts)
        return torch.autograd.grad(loss, inputs, allow_unused=True)

    ours = penalty(flashattn_ext.flash_attn_func(q, k, v, **kw, **extra))
    window = kw.get("window_size", (-1, -1))
    ref = penalty(attention64(q, k, v, causal=kw["causal"], window=window, softcap=kw.get("softcap", 0.0),
                              alibi_slopes=kw.get("alibi_slopes"), **extra)[0])
    for a, r in zip(ours, ref):
        a = torch.zeros_like(r) if a is None else a
        r = torch.zeros_like(a) if r is None else r
        torch.testing.assert_close(a, r, atol=1e-9, rtol=1e-9)


# ---- KV cache: random decode / append calls (the kv_append op, the CPU decode path, the general path) ------------


def draw_kvcache_case(seed):
    """A random test_kvcache.Case (KvCase): 1-10 queries (the CPU decode path takes <= 8), GQA ratios 1-8, dense caches
    (some read through cache_batch_idx, some strided) or paged ones, appends of 0-4 rows that may run past the
    cache (those rows are dropped), leftpad, rotary, and the score variants."""
    r = random.Random(seed)
    b, sq, hkv = r.randint(1, 4), r.randint(1, 10), r.randint(1, 3)
    h = hkv * r.choice((1, 2, 4, 8))
    d = r.choice((1, 8, 16, 24, 40, 64))
    page = r.choice((0, 0, 16, 32))
    cache = page * r.randint(1, 4) if page else r.randint(1, 80)
    new = r.randint(0, min(4, cache))
    seqlens = tuple(r.randint(0, cache) for _ in range(b)) if r.random() < 0.8 else r.randint(0, cache - new)
    rotary = r.choice((None, "gptj", "neox")) if new and d >= 2 else None
    window = r.choice(((-1, -1), (r.randint(0, 20), r.randint(0, 5)), (r.randint(0, 20), -1)))
    return KvCase(b=b, sq=sq, h=h, hkv=hkv, d=d, cache=cache, page=page, extra_pages=r.randint(0, 3),
                batch_cache=b + r.randint(0, 3) if not page and r.random() < 0.4 else 0, new=new, seqlens=seqlens,
                leftpad=tuple(r.randint(0, cache // 2) for _ in range(b)) if r.random() < 0.3 else None,
                rotary=rotary, rotary_dim=2 * r.randint(1, d // 2) if rotary else 16, causal=r.random() < 0.5,
                window=window, softcap=r.choice((0.0, 0.0, 3.0)), alibi=r.choice((None, None, "h", "bh")),
                sink=r.random() < 0.25, strided=not page and r.random() < 0.3, label=f"kvcache-{seed}")


KV_PARAMS = [pytest.param(seed, "cpu", dt, id=f"{seed}-cpu-{DTYPE_NAMES[dt]}") for seed in range(40)
             for dt in (torch.float64, torch.float32)] + \
            [pytest.param(seed, "cuda", dt, id=f"{seed}-cuda-{DTYPE_NAMES[dt]}", marks=requires_cuda)
             for seed in range(1000, 1040) for dt in (torch.float16, torch.bfloat16, torch.float32)]


@pytest.mark.parametrize("seed, device, dtype", KV_PARAMS)
def test_fuzz_kvcache(seed, device, dtype):
    """flash_attn_with_kvcache against test_kvcache's float64 reference (the caches after the append, out and
    lse) for random cases."""
    case = draw_kvcache_case(seed)
    t = make_kv_inputs(case, dtype, device, seed=seed)
    k_ref, v_ref, out_ref, lse_ref = kv_reference(case, t, dtype)
    out, lse = kv_call(case, t, return_softmax_lse=True)
    torch.testing.assert_close(t["k_cache"].cpu(), k_ref, rtol=CACHE_TOL[dtype], atol=CACHE_TOL[dtype])
    assert torch.equal(t["v_cache"].cpu(), v_ref), "v_cache after the append"
    assert_close("out", out, out_ref, OUT_TOL[dtype])
    assert_lse_close(lse, lse_ref, OUT_TOL[dtype])


# ----------------------------------------------------------------------------------------------
# T5's relative position bias (rel_bias; every dtype, on CUDA the simple kernels): random shapes, strides, buckets
# and variants against the float64 reference with the bias as an additive mask
# ----------------------------------------------------------------------------------------------

REL_BIAS_PARAMS = [pytest.param(seed, "cpu", id=f"{seed}-cpu") for seed in range(30)] + [
    pytest.param(seed, "cuda", id=f"{seed}-cuda", marks=requires_cuda) for seed in range(30, 70)]


@pytest.mark.parametrize("seed, device", REL_BIAS_PARAMS)
def test_fuzz_rel_bias(seed, device):
    r = random.Random(9000 + seed)
    dtype = r.choice((torch.float32, torch.float64, torch.float32, torch.float64, torch.bfloat16, torch.float16))
    table_dtype = torch.float64 if dtype == torch.float64 else torch.float32  # the lse dtype
    b, hkv = r.randint(1, 2), r.choice((1, 2))
    h = hkv * r.choice((1, 2, 3))
    sq, sk = log_uniform_int(r, 1, 300), log_uniform_int(r, 1, 300)
    d, dv = r.randint(1, 40), r.randint(1, 40)
    bidir = r.random() < 0.5
    nb = r.choice((4, 8, 32)) if bidir else r.choice((2, 8, 32))
    md = r.randint(nb // (4 if bidir else 2) + 1, 200)
    causal = r.random() < 0.4
    window = (r.randint(0, 60), r.randint(0, 60)) if r.random() < 0.3 else (-1, -1)
    softcap = r.uniform(1.0, 20.0) if r.random() < 0.3 else 0.0
    gen = torch.Generator().manual_seed(seed)
    transposed = r.random() < 0.4  # (b, h, s, d) storage

    def rand(*shape):
        if transposed:
            t = torch.randn(shape[0], shape[2], shape[1], shape[3], generator=gen, dtype=torch.float64)
            return t.transpose(1, 2)
        return torch.randn(*shape, generator=gen, dtype=torch.float64)
    q64, k64, v64, dout = rand(b, sq, h, d), rand(b, sk, hkv, d), rand(b, sk, hkv, dv), rand(b, sq, h, dv)
    table64 = torch.randn(h, nb, generator=gen, dtype=torch.float64)
    sink64 = torch.randn(h, generator=gen, dtype=torch.float64) if r.random() < 0.3 else None
    q, k, v = (x.to(device, dtype).requires_grad_() for x in (q64, k64, v64))
    table = table64.to(device, table_dtype).requires_grad_()
    sink = sink64.to(device, table_dtype).requires_grad_() if sink64 is not None else None
    out = flashattn_ext.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap, sink=sink,
                                        rel_bias=table, rel_bias_max_distance=md, rel_bias_bidirectional=bidir)
    out.backward(dout.to(device, dtype))
    qr, kr, vr = (x.detach().cpu().double().requires_grad_() for x in (q, k, v))
    tr = table.detach().cpu().double().requires_grad_()
    sr = sink.detach().cpu().double().requires_grad_() if sink is not None else None
    ref, _ = attention_ref(qr, kr, vr, causal=causal, window_size=window, softcap=softcap, sink=sr,
                           attn_mask=bias_matrix(tr, sq, sk, md, bidir).unsqueeze(0))
    ref.backward(dout.to(dtype).double())  # the dout the call got (rounded to dtype)
    tol = {torch.float64: 1e-9, torch.float32: 5e-4, torch.bfloat16: 1.5e-2, torch.float16: 2e-3}[dtype]
    pairs = [("out", out, ref), ("dq", q.grad, qr.grad), ("dk", k.grad, kr.grad), ("dv", v.grad, vr.grad),
             ("drel_bias", table.grad, tr.grad)] + ([("dsink", sink.grad, sr.grad)] if sink is not None else [])
    for name, got, want in pairs:
        err = (got.detach().cpu().double() - want).abs().max().item() / max(1.0, want.abs().max().item())
        assert err < tol, (name, err)
