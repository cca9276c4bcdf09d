"""Issue 36 (items 1 and 2): v with a head dim of its own (d_v != d_qk: out, dout and dv take v's, the scale and lse
q's) and head dims past 256. flash_attn_func with every variant, varlen (packed and paged), the KV cache, SDPA, the
nn module's parameters, the packed forms' and the ops' errors, gradcheck and double backward in float64, against the
independent float64 reference of fa_testing.py (torch's own SDPA math in float64 for SDPA). CPU in CI; the same tests
on CUDA (skipped without one), where the binding zero-pads the smaller of the two head dims (each <= 512 there; in
fp16 / bf16 the KV cache <= 256)."""
import math

import pytest
import torch

import flashattn_ext
from flashattn_ext.integrations.torch_registry import smem_per_block
from fa_testing import (KVCACHE_FWD_ARGS, VARLEN_BWD_ARGS, VARLEN_FWD_ARGS, kvcache_fwd_op, opcheck_call, varlen_bwd_op,
                        varlen_fwd_op)
from fa_testing import (
    DEVICES,
    DTYPE_NAMES,
    OUT_TOL,
    Cfg,
    Var,
    assert_close,
    assert_lse_close,
    attention64,
    check_variant_results,
    grad_tol,
    make_inputs,
    make_variant_tensors,
    op_bwd_args,
    op_fwd_args,
    replay_keep_mask,
    requires_cuda,
    run_python,
    run_flash,
    run_sdpa,
    variant_grad_inputs,
    variant_grad_names,
    variant_reference,
)

DROPOUT_SEED = 4321
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# (d_qk, d_v) pairs: MLA prefill (192, 128) and decode (576, 512), d_v > d_qk, d_v = 1, d_qk = 1.
SHAPES = [
    Cfg(2, 37, 53, 4, 2, 192, causal=True, dv=128),
    Cfg(1, 45, 30, 6, 2, 16, layout="bhsd", dv=40),
    Cfg(2, 30, 45, 2, 2, 24, causal=True, scale=0.4, layout="slice", dv=1),
    Cfg(1, 20, 33, 4, 1, 8, layout="mixed", dv=72),
    Cfg(2, 17, 17, 2, 1, 1, causal=True, layout="bcast", dv=9),
]
FEATURES = [Var(), Var(window=(11, 5)), Var(softcap=1.0), Var(alibi="bh"), Var(sink=True),
            Var(mask="bool", mask_dims="b1qk"), Var(mask="add", mask_dims="1hqk"), Var(dropout=0.17)]
EVERYTHING = Var(window=(11, 5), softcap=1.0, alibi="h", sink=True, mask="add", mask_dims="b1qk", dropout=0.17)
VARIANTS = FEATURES + [EVERYTHING]


def params(shapes, variants, dtypes=DTYPES):
    out = []
    for dev in ("cpu", "cuda"):
        for dt in dtypes:
            for cfg in shapes:
                for var in variants:
                    out.append(pytest.param(cfg, var, dev, dt, id=f"{dev}-{DTYPE_NAMES[dt]}-{cfg.id}-{var.id}",
                                            marks=[requires_cuda] if dev == "cuda" else []))
    return out


def run_and_check(cfg, var, device, dtype, api="flash"):
    q, k, v, dout = make_inputs(cfg, dtype, device)
    t = make_variant_tensors(cfg, var, dtype, device)
    keep = replay_keep_mask(q, k, v, cfg, var, t, DROPOUT_SEED, bottom_right=api == "flash") if var.dropout else None
    torch.manual_seed(DROPOUT_SEED)
    if api == "flash":
        out, lse = run_flash(q, k, v, cfg, var, t)
        assert lse.shape == (cfg.b, cfg.h, cfg.sq)
    else:
        out, lse = run_sdpa(q, k, v, cfg, var, t), None
    assert out.shape == (cfg.b, cfg.sq, cfg.h, cfg.d_v) and out.dtype == dtype
    grads = torch.autograd.grad(out, variant_grad_inputs(q, k, v, t), dout)
    got = dict(zip(variant_grad_names(t), grads), out=out, lse=lse)
    assert got["dq"].shape == q.shape and got["dk"].shape == k.shape and got["dv"].shape == v.shape
    check_variant_results(got, variant_reference(q, k, v, dout, cfg, var, t, keep=keep, bottom_right=api == "flash"),
                          dtype)


@pytest.mark.parametrize("cfg, var, device, dtype", params(SHAPES, VARIANTS, (torch.float32, torch.float64)) +
                         params(SHAPES, [Var(), EVERYTHING], (torch.float16, torch.bfloat16)))
def test_flash_attn_func_dv(cfg, var, device, dtype):
    run_and_check(cfg, var, device, dtype)


SDPA_SHAPES = [Cfg(2, 37, 53, 4, 2, 24, dv=40), Cfg(1, 30, 45, 2, 2, 192, causal=True, layout="bhsd", dv=128)]


@pytest.mark.parametrize("cfg, var, device, dtype", [
    p for p in params(SDPA_SHAPES, [Var(), Var(mask="add", mask_dims="1hqk"), Var(dropout=0.17)])
    if not (p.values[0].causal and p.values[1].mask)])
def test_sdpa_dv(cfg, var, device, dtype):
    run_and_check(cfg, var, device, dtype, api="sdpa")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dims", [(24, 40), (40, 24)], ids=lambda d: f"d{d[0]}-dv{d[1]}")
def test_sdpa_dv_matches_torch(device, dims):
    """Against torch's own SDPA (math, float64) on its (B, H, S, D) layout, 2-D and GQA inputs included; gradients
    too."""
    d, dv = dims
    gen = torch.Generator().manual_seed(7)
    cases = [((2, 4, 9, d), (2, 4, 13, d), (2, 4, 13, dv), {}),
             ((2, 4, 9, d), (2, 2, 13, d), (2, 2, 13, dv), {"enable_gqa": True, "is_causal": True}),
             ((9, d), (13, d), (13, dv), {"scale": 0.3})]
    for qs, ks, vs, kw in cases:
        q, k, v = (torch.randn(s, generator=gen, dtype=torch.float64).to(device).requires_grad_()
                   for s in (qs, ks, vs))
        out = flashattn_ext.scaled_dot_product_attention(q, k, v, **kw)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)
        assert out.shape == ref.shape == (*qs[:-1], dv)
        assert_close("out", out, ref, OUT_TOL[torch.float64])
        dout = torch.randn(ref.shape, generator=gen, dtype=torch.float64).to(device)
        got, want = torch.autograd.grad(out, (q, k, v), dout), torch.autograd.grad(ref, (q, k, v), dout)
        for name, g, r in zip("qkv", got, want):
            assert_close("d" + name, g, r, OUT_TOL[torch.float64])


# ----------------------------------------------------------------------------------------------
# Head dims past 256 (the CPU takes any; CUDA stops at 512, in fp16 / bf16 the KV cache at 256)
# ----------------------------------------------------------------------------------------------

LARGE = [Cfg(1, 130, 70, 2, 1, 257, causal=True), Cfg(1, 40, 130, 2, 2, 512, layout="bhsd"),
         Cfg(1, 33, 65, 2, 1, 320, dv=480), Cfg(1, 65, 33, 2, 2, 512, causal=True, dv=257),
         Cfg(1, 20, 40, 1, 1, 768, layout="slice", dv=640)]
LARGE_VARIANTS = [Var(), Var(window=(20, 3), softcap=1.5, alibi="h", sink=True, dropout=0.2)]


@pytest.mark.parametrize("cfg", LARGE, ids=lambda c: c.id)
@pytest.mark.parametrize("var", LARGE_VARIANTS, ids=lambda v: v.id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=lambda d: DTYPE_NAMES[d])
def test_large_head_dims_cpu(cfg, var, dtype):
    run_and_check(cfg, var, "cpu", dtype)


@requires_cuda
@pytest.mark.parametrize("cfg", [c for c in LARGE if max(c.d, c.d_v) <= 512], ids=lambda c: c.id)
@pytest.mark.parametrize("var", LARGE_VARIANTS + [Var(mask="add", mask_dims="1hqk")], ids=lambda v: v.id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=lambda d: DTYPE_NAMES[d])
def test_large_head_dims_cuda(cfg, var, dtype):
    """fp32 / fp64 on CUDA up to 512 (simple.cu: 16 columns per lane, the K / V tiles sized by
    the head dim, above 48 KB by the opt-in at fp64 d > 384)."""
    run_and_check(cfg, var, "cuda", dtype)


HALF_LARGE = [Cfg(1, 130, 70, 2, 1, 264, causal=True), Cfg(2, 300, 330, 4, 2, 512), Cfg(1, 45, 190, 2, 1, 512,
              causal=True, layout="bhsd"), Cfg(1, 33, 65, 2, 1, 320, dv=480), Cfg(1, 65, 33, 2, 2, 512, dv=264)]


@requires_cuda
@pytest.mark.parametrize("cfg", HALF_LARGE, ids=lambda c: c.id)
@pytest.mark.parametrize("var", LARGE_VARIANTS + [Var(mask="add", mask_dims="1hqk"), Var(alibi="bh", window=(40, 7))],
                         ids=lambda v: v.id)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda d: DTYPE_NAMES[d])
def test_large_head_dims_cuda_half(cfg, var, dtype):
    """fp16 / bf16 on CUDA at head dims 257..512 against the float64 reference: the forward on fwd_sm80.cu's d512
    config (O in two launches of 256 columns each, both over the whole S), the backward on bwd_sm80.cu's (two CTAs per
    key tile, each dK, dV and dQ of 256 columns, both over the whole S^T and dP^T; dbias from one of them); on a GPU
    without their shared memory the fp32 kernels (ops_cuda.cpp half_on_fp32: inputs converted, results rounded)."""
    run_and_check(cfg, var, "cuda", dtype)


HALF_ON_FP32 = (
    "import warnings, torch, flashattn_ext\n"
    "q = torch.randn(1, 70, 2, {d}, device='cuda', dtype=torch.bfloat16, requires_grad=True)\n"
    "with warnings.catch_warnings(record=True) as caught:\n"
    "    warnings.simplefilter('always')\n"
    "    for _ in range(2):\n"
    "        flashattn_ext.flash_attn_func(q, q, q, causal=True, deterministic={det}).sum().backward()\n"
    "print('KERNELS', flashattn_ext._C.last_cuda_kernels()[1])\n"
    "print('WARNINGS', [str(w.message) for w in caught])\n"
)


@requires_cuda
def test_cuda_half_backward_on_fp32_warns_once():
    """The deterministic fp16 / bf16 backward above 256 runs on the fp32 kernels (bwd_sm80.cu's dQ kernel stops at
    256; the kernel report names simple.cu) and says so in one warning per process, naming the head dim."""
    proc = run_python(["-c", HALF_ON_FP32.format(d=320, det=True)], {})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "KERNELS simple.cu" in proc.stdout, proc.stdout
    warned = proc.stdout.split("WARNINGS", 1)[1]
    assert warned.count("has no tensor-core kernel") == 1 and "backward at head dim 320" in warned, warned


@requires_cuda
def test_cuda_half_backward_above_256_on_tensor_cores():
    """The fp16 / bf16 backward above 256 runs on bwd_sm80.cu's d512 config where the GPU has its shared memory
    (Hopper), without a warning; elsewhere on the fp32 kernels with one (the test above)."""
    proc = run_python(["-c", HALF_ON_FP32.format(d=320, det=False)], {})
    assert proc.returncode == 0, proc.stderr[-2000:]
    warned = proc.stdout.split("WARNINGS", 1)[1]
    tensor_cores = "KERNELS bwd_sm80.cu" in proc.stdout
    hopper = torch.cuda.get_device_capability()[0] == 9 and smem_per_block(torch.cuda.current_device()) >= 227 * 1024
    assert tensor_cores or not hopper, proc.stdout  # 227 KB per block (not capped by FLASHATTN_EXT_SMEM_LIMIT)
    assert tensor_cores == ("backward at head dim 320" not in warned), proc.stdout
    assert tensor_cores or "KERNELS simple.cu" in proc.stdout, proc.stdout


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda d: DTYPE_NAMES[d])
def test_cuda_half_head_dim_512_paged_raises(dtype):
    """A paged KV cache stays at 256 in fp16 / bf16 (no paged d512 kernel): a clear error, the cache unchanged."""
    q = torch.randn(1, 1, 2, 320, device="cuda", dtype=dtype)
    k_cache, v_cache = (torch.randn(4, 16, 2, 320, device="cuda", dtype=dtype) for _ in range(2))
    block_table = torch.arange(4, dtype=torch.int32, device="cuda").view(1, 4)
    saved = k_cache.clone()
    with pytest.raises(ValueError, match="at most 256 for float16 / bfloat16"):
        flashattn_ext.flash_attn_with_kvcache(q, k_cache, v_cache, k=q, v=q, cache_seqlens=5,
                                              block_table=block_table)
    assert torch.equal(k_cache, saved)


@requires_cuda
@pytest.mark.parametrize("dtype,dims", [(dt, dims) for dt in (torch.float16, torch.bfloat16)
                                        for dims in ((544, 64), (64, 520), (513, 513))] +
                         [(dt, dims) for dt in (torch.float32, torch.float64)
                          for dims in ((544, 64), (64, 520), (513, 513))],
                         ids=lambda x: DTYPE_NAMES[x] if isinstance(x, torch.dtype) else f"d{x[0]}-dv{x[1]}")
def test_cuda_head_dim_limit(dtype, dims):
    """CUDA raises above its limit (512; the KV cache 256 in fp16 / bf16), naming the argument and the limit, for
    q/k and for v (and v_cache)."""
    d, dv = dims
    half = dtype in (torch.float16, torch.bfloat16)
    top, kind = 512, "float16 / bfloat16" if half else "float32 / float64"
    q = torch.randn(1, 4, 2, d, device="cuda", dtype=dtype)
    k, v = torch.randn(1, 6, 2, d, device="cuda", dtype=dtype), torch.randn(1, 6, 2, dv, device="cuda", dtype=dtype)
    name = "q and k" if d > top else "v"
    with pytest.raises(RuntimeError, match=rf"head dim \(last dimension\) of {name} must be at most {top} for "
                                           rf"{kind}, got {max(d, dv)}"):
        flashattn_ext.flash_attn_func(q, k, v)
    # before anything is appended: the cache is unchanged
    top_cache = 256 if half else 512  # the KV cache's fp16 / bf16 kernels (decode, paged) stop at 256
    name = "q and k_cache" if d > top_cache else "v_cache"
    k_cache, v_cache = k.clone(), v.clone()
    with pytest.raises(ValueError, match=rf"of {name} must be at most {top_cache} for {kind}, got {max(d, dv)}"):
        flashattn_ext.flash_attn_with_kvcache(q, k_cache, v_cache, k=k[:, :1], v=v[:, :1], cache_seqlens=2)
    assert torch.equal(k_cache, k) and torch.equal(v_cache, v)


# ----------------------------------------------------------------------------------------------
# gradcheck and double backward (float64)
# ----------------------------------------------------------------------------------------------

GRAD_PAIRS = [(3, 5), (5, 1), (1, 4), (192, 128), (576, 512)]
GRAD_VARIANTS = [Var(), Var(window=(2, 1)), Var(softcap=0.8), Var(alibi="bh"), Var(sink=True),
                 Var(mask="bool", mask_dims="b1qk"), Var(mask="add", mask_dims="1hqk"), Var(dropout=0.3),
                 Var(window=(2, 1), softcap=0.8, alibi="h", sink=True, mask="add", mask_dims="b1qk", dropout=0.3)]


def variant_fn(cfg, var, tensors, api="flash"):
    """out as a function of (q, k, v[, sink][, float mask]), the dropout generator reseeded before each call."""
    has_sink = tensors["sink"] is not None
    has_fmask = tensors["attn_mask"] is not None and tensors["attn_mask"].dtype != torch.bool

    def fn(q, k, v, *rest):
        rest, t = list(rest), dict(tensors)
        if has_sink:
            t["sink"] = rest.pop(0)
        if has_fmask:
            t["attn_mask"] = rest.pop(0)
        torch.manual_seed(DROPOUT_SEED)
        return run_flash(q, k, v, cfg, var, t)[0] if api == "flash" else run_sdpa(q, k, v, cfg, var, t)
    return fn


@pytest.fixture
def one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def dims_devices(pairs):
    """(dims, device) params of the float64 tests: CUDA only where both head dims are <= 512 (its refusal above is
    test_cuda_head_dim_limit's)."""
    return [pytest.param(dims, dev.values[0], id=f"d{dims[0]}-dv{dims[1]}-{dev.id}", marks=dev.marks)
            for dims in pairs for dev in DEVICES if dev.values[0] == "cpu" or max(dims) <= 512]


def grad_inputs(cfg, var, device):
    q, k, v, _ = make_inputs(cfg, torch.float64, device, requires_grad=False)
    t = make_variant_tensors(cfg, var, torch.float64, device)
    return t, tuple(variant_grad_inputs(*(x.detach().requires_grad_() for x in (q, k, v)), t))


@pytest.mark.parametrize("var", GRAD_VARIANTS, ids=lambda v: v.id)
@pytest.mark.parametrize("dims,device", dims_devices(GRAD_PAIRS))
def test_gradcheck_dv(dims, var, device, one_thread):
    """GQA 2, causal, sq < sk; the large pairs in gradcheck's fast mode (random projections of the Jacobian)."""
    d, dv = dims
    cfg = Cfg(1, 3, 5, 2, 1, d, causal=True, dv=dv)
    t, inputs = grad_inputs(cfg, var, device)
    assert torch.autograd.gradcheck(variant_fn(cfg, var, t), inputs, fast_mode=max(d, dv) > 8)


@pytest.mark.parametrize("var", [Var(), Var(sink=True, mask="add", mask_dims="b1qk", dropout=0.3),
                                 Var(window=(2, 0), softcap=0.8, alibi="h")], ids=lambda v: v.id)
@pytest.mark.parametrize("dims,device", dims_devices([(3, 5), (4, 1), (192, 128), (512, 512)]))
def test_gradgradcheck_dv(dims, var, device, one_thread):
    """Second derivatives (the backward's own autograd), d_v != d_qk and d 512."""
    d, dv = dims
    cfg = Cfg(1, 3, 4, 2, 1, d, dv=dv)
    t, inputs = grad_inputs(cfg, var, device)
    assert torch.autograd.gradgradcheck(variant_fn(cfg, var, t), inputs, fast_mode=max(d, dv) > 8)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_sdpa_dv(device, one_thread):
    cfg, var = Cfg(1, 4, 5, 2, 1, 3, dv=6), Var(mask="add", mask_dims="b1qk", dropout=0.3)
    t, inputs = grad_inputs(cfg, var, device)
    assert torch.autograd.gradcheck(variant_fn(cfg, var, t, "sdpa"), inputs)


# ----------------------------------------------------------------------------------------------
# Variable-length batches and the KV cache
# ----------------------------------------------------------------------------------------------

def varlen_batch(lens_q, lens_k, h, hkv, d, dv, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64).to(device, dtype)  # noqa: E731
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32, device=device)
    q, k, v = rnd(sum(lens_q), h, d), rnd(sum(lens_k), hkv, d), rnd(sum(lens_k), hkv, dv)
    return q, k, v, cu_q, cu_k, rnd(sum(lens_q), h, dv)


def varlen_reference(q, k, v, dout, lens_q, lens_k, **kw):
    """attention64 per sequence: out, lse (nheads, total_q), dq, dk, dv."""
    leaves = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
    outs, lses, q0, k0 = [], [], 0, 0
    for sq, sk in zip(lens_q, lens_k):
        o, l = attention64(*(t[None, a:a + n] for t, a, n in zip(leaves, (q0, k0, k0), (sq, sk, sk))), **kw)
        outs.append(o[0])
        lses.append(l[0])
        q0, k0 = q0 + sq, k0 + sk
    out, lse = torch.cat(outs), torch.cat(lses, -1)
    grads = torch.autograd.grad(out, leaves, dout.detach().cpu().double())
    return (out.detach(), lse.detach(), *grads)


VARLEN_VARIANTS = [dict(), dict(causal=True), dict(window_size=(3, 1), softcap=1.2), dict(causal=True, sink=True),
                   dict(alibi=True)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=lambda d: DTYPE_NAMES[d])
@pytest.mark.parametrize("kw", VARLEN_VARIANTS, ids=lambda kw: "-".join(kw) or "dense")
@pytest.mark.parametrize("dims", [(192, 128), (16, 40), (24, 1), (320, 480)], ids=lambda d: f"d{d[0]}-dv{d[1]}")
def test_varlen_dv(dims, kw, dtype, device):
    d, dv = dims
    lens_q, lens_k, h, hkv = [5, 0, 70, 9], [8, 3, 66, 1], 4, 2
    q, k, v, cu_q, cu_k, dout = varlen_batch(lens_q, lens_k, h, hkv, d, dv, dtype, device)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    gen = torch.Generator().manual_seed(3)
    sink = (torch.rand(h, generator=gen, dtype=torch.float64) if kw.get("sink") else None)
    slopes = torch.rand(h, generator=gen) * 0.5 if kw.get("alibi") else None
    args = dict(causal=kw.get("causal", False), window_size=kw.get("window_size", (-1, -1)),
                softcap=kw.get("softcap", 0.0))
    out, lse = flashattn_ext.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), **args, return_lse=True,
        alibi_slopes=None if slopes is None else slopes.to(device),
        sink=None if sink is None else sink.to(device))
    assert out.shape == (sum(lens_q), h, dv)
    got = (out, lse, *torch.autograd.grad(out, (q, k, v), dout))
    ref = varlen_reference(q, k, v, dout, lens_q, lens_k, causal=args["causal"], window=args["window_size"],
                           softcap=args["softcap"], alibi_slopes=slopes, sink=sink)
    assert_close("out", got[0], ref[0], OUT_TOL[dtype])
    assert_lse_close(got[1], ref[1], OUT_TOL[dtype])
    for name, g, r in zip(("dq", "dk", "dv"), got[2:], ref[2:]):
        assert g.shape == r.shape
        assert_close(name, g, r, grad_tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dims", [(3, 5), (5, 1), (192, 128)], ids=lambda d: f"d{d[0]}-dv{d[1]}")
def test_gradcheck_varlen_dv(dims, device, one_thread):
    d, dv = dims
    q, k, v, cu_q, cu_k, _ = varlen_batch([2, 3], [4, 2], 2, 1, d, dv, torch.float64, device)
    sink = torch.tensor([0.3, -0.5], dtype=torch.float64, device=device)

    def fn(q, k, v, sink):
        torch.manual_seed(DROPOUT_SEED)
        return flashattn_ext.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 4, dropout_p=0.3, causal=True,
                                                    softcap=0.9, sink=sink)
    inputs = tuple(t.requires_grad_() for t in (q, k, v, sink))
    assert torch.autograd.gradcheck(fn, inputs, fast_mode=d > 8)
    assert torch.autograd.gradgradcheck(fn, inputs, fast_mode=d > 8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=lambda d: DTYPE_NAMES[d])
def test_paged_varlen_dv(dtype, device):
    """flash_attn_varlen_func with a block_table: k pages with headdim, v pages with headdim_v."""
    d, dv, h, hkv, page, pages = 40, 24, 4, 2, 16, 6
    gen = torch.Generator().manual_seed(5)
    rnd = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64).to(device, dtype)  # noqa: E731
    k_pages, v_pages = rnd(pages, page, hkv, d), rnd(pages, page, hkv, dv)
    table = torch.tensor([[4, 1, 0], [2, 5, 3]], dtype=torch.int32, device=device)
    lens_q, lens_k = [3, 7], [40, 21]
    q = rnd(sum(lens_q), h, d)
    cu_q = torch.tensor([0, 3, 10], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 40, 61], dtype=torch.int32, device=device)
    out = flashattn_ext.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, 7, 40, causal=True, block_table=table)
    assert out.shape == (10, h, dv)
    for s, (q0, sq, sk) in enumerate([(0, 3, 40), (3, 7, 21)]):
        rows = torch.arange(sk, device=device)
        idx = table[s].long()[rows // page]
        ks, vs = k_pages[idx, rows % page], v_pages[idx, rows % page]
        ref, _ = attention64(q[None, q0:q0 + sq].cpu(), ks[None].cpu(), vs[None].cpu(), causal=True)
        assert_close(f"out of sequence {s}", out[q0:q0 + sq], ref[0], OUT_TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=lambda d: DTYPE_NAMES[d])
@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
@pytest.mark.parametrize("dims,device", dims_devices([(576, 512), (64, 96), (8, 1)]))
def test_kvcache_dv(dims, paged, dtype, device):
    """Decode and chunked prefill against a cache whose v has its own head dim (MLA decode: 576 / 512); new k, v
    appended; GQA 2, causal, a sink."""
    d, dv = dims
    batch, h, hkv, seqlen_q, cache_len, page = 2, 4, 2, 3, 48, 16
    gen = torch.Generator().manual_seed(11)
    rnd = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64).to(device, dtype)  # noqa: E731
    q, k_new, v_new = rnd(batch, seqlen_q, h, d), rnd(batch, seqlen_q, hkv, d), rnd(batch, seqlen_q, hkv, dv)
    seqlens = torch.tensor([20, 33], dtype=torch.int32, device=device)
    sink = torch.tensor([0.5, -1.0, 0.0, 2.0], device=device)
    if paged:
        table = torch.tensor([[5, 0, 2], [1, 4, 3]], dtype=torch.int32, device=device)
        k_cache, v_cache = rnd(6, page, hkv, d), rnd(6, page, hkv, dv)
    else:
        table = None
        k_cache, v_cache = rnd(batch, cache_len, hkv, d), rnd(batch, cache_len, hkv, dv)
    out, lse = flashattn_ext.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                                     block_table=table, causal=True, sink=sink,
                                                     return_softmax_lse=True)
    assert out.shape == (batch, seqlen_q, h, dv)
    for b in range(batch):
        n = int(seqlens[b]) + seqlen_q
        rows = torch.arange(n, device=device)
        if paged:
            idx = table[b].long()[rows // page]
            keys, values = k_cache[idx, rows % page], v_cache[idx, rows % page]
        else:
            keys, values = k_cache[b, :n], v_cache[b, :n]
        assert torch.equal(values[-seqlen_q:], v_new[b])  # appended in place
        ref, ref_lse = attention64(q[b:b + 1].cpu(), keys[None].cpu(), values[None].cpu(), causal=True, sink=sink.cpu())
        assert_close(f"out of sequence {b}", out[b:b + 1], ref, OUT_TOL[dtype])
        assert_lse_close(lse[b:b + 1], ref_lse, OUT_TOL[dtype])


# ----------------------------------------------------------------------------------------------
# Bad inputs
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_dv_errors(device):
    q = torch.randn(1, 2, 2, 16, device=device)
    k_cache, v_cache = torch.randn(1, 8, 2, 16, device=device), torch.randn(1, 8, 2, 12, device=device)
    k, v = torch.randn(1, 1, 2, 16, device=device), torch.randn(1, 1, 2, 12, device=device)
    seqlens = torch.tensor([3], dtype=torch.int32, device=device)
    before = v_cache.clone()
    with pytest.raises(ValueError, match=r"v must have shape \(batch, seqlen_new, nheads_kv, head dim of v_cache\) = "
                                         r"\(1, 'seqlen_new', 2, 12\), got \(1, 1, 2, 16\)"):
        flashattn_ext.flash_attn_with_kvcache(q, k_cache, v_cache, k, k, cache_seqlens=seqlens)
    with pytest.raises(ValueError, match=r"k must have shape \(batch, seqlen_new, nheads_kv, head dim of k_cache\)"):
        flashattn_ext.flash_attn_with_kvcache(q, k_cache, v_cache, v, v, cache_seqlens=seqlens)
    assert torch.equal(v_cache, before)  # raised before anything was written
    with pytest.raises(ValueError, match=r"the head dim of k_cache \(12\) must be that of q \(16\)"):
        flashattn_ext.flash_attn_with_kvcache(q, v_cache, v_cache)
    with pytest.raises(ValueError, match="v_cache must have the shape of k_cache .* but for its head dim"):
        flashattn_ext.flash_attn_with_kvcache(q, k_cache, torch.randn(1, 7, 2, 12, device=device))
    with pytest.raises(RuntimeError, match=r"head dim \(last dimension\) of q and k_cache must match, got q 16, "
                                           r"k_cache 12"):
        kvcache_fwd_op(q, v_cache, v_cache, seqlens, None, None, None, 0.25, False, -1, -1, 0.0, None, None)


@pytest.mark.parametrize("device", DEVICES)
def test_packed_and_mismatched_head_dims_raise(device):
    q, kv = torch.randn(1, 3, 2, 16, device=device), torch.randn(1, 5, 2, 2, 12, device=device)
    with pytest.raises(ValueError, match=r"flash_attn_kvpacked_func: kv \(batch, seqlen_k, 2, nheads_kv, headdim\) "
                                         r"packs k and v with one head dim, which must be that of q \(16\), got 12"):
        flashattn_ext.flash_attn_kvpacked_func(q, kv)
    cu = torch.tensor([0, 3], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"flash_attn_varlen_kvpacked_func: kv .* must be that of q \(16\), got 12"):
        flashattn_ext.flash_attn_varlen_kvpacked_func(q[0], kv[0], cu, cu, 3, 3)
    k, v = torch.randn(1, 5, 2, 12, device=device), torch.randn(1, 5, 2, 16, device=device)
    with pytest.raises(RuntimeError, match=r"head dim \(last dimension\) of q and k must match, got q 16, k 12"):
        flashattn_ext.flash_attn_func(q, k, v)
    with pytest.raises(ValueError, match=r"key's head dim \(12\) must equal query's \(16\)"):
        flashattn_ext.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))


@pytest.mark.parametrize("device", DEVICES)
def test_bwd_op_out_shapes(device):
    """bwd / varlen_bwd take out and dout with v's head dim: q's (the old rule) raises, naming them."""
    cfg, var = Cfg(1, 4, 6, 2, 1, 8, dv=5), Var()
    q, k, v, dout = make_inputs(cfg, torch.float64, device, requires_grad=False)
    t = make_variant_tensors(cfg, var, torch.float64, device)
    out, lse, rng, _ = torch.ops.flashattn_ext.fwd(*op_fwd_args(q, k, v, cfg, var, t))
    assert out.shape == (1, 4, 2, 5)
    wrong = torch.zeros(1, 4, 2, 8, dtype=torch.float64, device=device)
    for args, name in ((op_bwd_args(wrong, q, k, v, out, lse, rng, cfg, var, t), "dout"),
                       (op_bwd_args(dout, q, k, v, wrong, lse, rng, cfg, var, t), "out")):
        with pytest.raises(RuntimeError, match=rf"{name} must have the shape of q with the head dim of v "
                                               rf"\(1, 4, 2, 5\)"):
            torch.ops.flashattn_ext.bwd(*args)
    cu = torch.tensor([0, 4], dtype=torch.int32, device=device)
    ck = torch.tensor([0, 6], dtype=torch.int32, device=device)
    with pytest.raises(RuntimeError, match=r"out must have the shape of q with the head dim of v \(4, 2, 5\)"):
        varlen_bwd_op(dout[0], q[0], k[0], v[0], wrong[0], lse[0], rng, cu, ck, None, 4, 6, 0.3,
                                           False, -1, -1, 0.0, None, None, 0.0, False)


# ----------------------------------------------------------------------------------------------
# opcheck (fake kernels, schemas, autograd registrations) with d_v != d_qk
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_dv(device):
    cfg, var = Cfg(2, 9, 21, 4, 2, 8, causal=True, layout="mixed", dv=12), Var(sink=True, mask="add")
    q, k, v, dout = make_inputs(cfg, torch.float64, device)
    t = make_variant_tensors(cfg, var, torch.float64, device)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    torch.library.opcheck(torch.ops.flashattn_ext.fwd.default, op_fwd_args(*leaves, cfg, var, t))
    detached = {n: (x.detach() if x is not None else None) for n, x in t.items()}
    out, lse, rng, _ = torch.ops.flashattn_ext.fwd(*op_fwd_args(q.detach(), k.detach(), v.detach(), cfg, var, detached))
    torch.library.opcheck(torch.ops.flashattn_ext.bwd.default,
                          op_bwd_args(dout, q.detach(), k.detach(), v.detach(), out, lse, rng, cfg, var, detached))
    qv, kv_, vv, cu_q, cu_k, dv_out = varlen_batch([3, 6], [7, 2], 4, 2, 8, 12, torch.float64, device)
    varlen = (qv, kv_, vv, cu_q, cu_k, None, 6, 7, 0.35, True, -1, -1, 0.0, None, None, 0.0, False)
    opcheck_call(VARLEN_FWD_ARGS, varlen)
    o, l, r, _ = varlen_fwd_op(*varlen)
    opcheck_call(VARLEN_BWD_ARGS, (dv_out, qv, kv_, vv, o, l, r, cu_q, cu_k, None, 6, 7, 0.35, True, -1, -1, 0.0, None,
                                   None, 0.0, False))
    cache = (qv.view(1, 9, 4, 8), kv_.view(1, 9, 2, 8), vv.view(1, 9, 2, 12))
    opcheck_call(KVCACHE_FWD_ARGS, (*cache, None, None, None, None, 0.35, True, -1, -1, 0.0, None, None, 0))


def test_default_scale_is_q_head_dim():
    """softmax_scale defaults to 1 / sqrt(d_qk), as flash-attn and torch: not v's head dim."""
    cfg = Cfg(1, 5, 7, 2, 2, 16, dv=64)
    q, k, v, _ = make_inputs(cfg, torch.float64, "cpu", requires_grad=False)
    out = flashattn_ext.flash_attn_func(q, k, v)
    ref, _ = attention64(q, k, v, 1.0 / math.sqrt(16))
    assert_close("out", out, ref, OUT_TOL[torch.float64])
    wrong, _ = attention64(q, k, v, 1.0 / math.sqrt(64))
    assert (out - wrong).abs().max() > 1e-3
