"""torch.library.opcheck of the fwd and bwd ops and torch.compile(fullgraph=True) of the public
functions, fed by the SMOKE subset of the one SAMPLES list (with every variant off; the variants'
opcheck and compile tests are in test_variants.py); flash_attn_varlen_func compiled once for every
max_seqlen."""
import pytest
import torch
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend

import flashattn_ext
from fa_testing import (
    DEVICES,
    OUT_TOL,
    SMOKE,
    Cfg,
    Var,
    assert_close,
    assert_lse_close,
    attention64,
    device_dtype_params,
    grad_tol,
    make_inputs,
    op_bwd_args,
    op_fwd_args,
    reference_with_grads,
)

DENSE = Var()


# ----------------------------------------------------------------------------------------------
# opcheck
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bottom_right", [True, False], ids=["bottom_right", "top_left"])
@pytest.mark.parametrize("cfg", SMOKE, ids=lambda c: c.id)
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_fwd(device, cfg, bottom_right):
    for requires_grad in (True, False):
        q, k, v, _ = make_inputs(cfg, torch.float64, device, requires_grad=requires_grad)
        torch.library.opcheck(torch.ops.flashattn_ext.fwd.default, op_fwd_args(q, k, v, cfg, DENSE, {}, bottom_right))


@pytest.mark.parametrize("cfg", SMOKE, ids=lambda c: c.id)
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_bwd(device, cfg):
    q, k, v, dout = make_inputs(cfg, torch.float64, device, requires_grad=False)
    out, lse, rng_state, _ = torch.ops.flashattn_ext.fwd(*op_fwd_args(q, k, v, cfg, DENSE, {}))
    torch.library.opcheck(torch.ops.flashattn_ext.bwd.default,
                          op_bwd_args(dout, q, k, v, out, lse, rng_state, cfg, DENSE, {}))


# ----------------------------------------------------------------------------------------------
# torch.compile
# ----------------------------------------------------------------------------------------------

def flash_fn(cfg):
    def fn(q, k, v):
        return flashattn_ext.flash_attn_func(q, k, v, softmax_scale=cfg.scale, causal=cfg.causal, return_lse=True)
    return fn


def sdpa_fn(cfg):
    def fn(q, k, v):
        out = flashattn_ext.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=cfg.causal, scale=cfg.scale,
            enable_gqa=cfg.h != cfg.hkv)
        return out.transpose(1, 2), None
    return fn


def run_and_grad(fn, q, k, v, dout):
    out, lse = fn(q, k, v)
    return (out, lse) + torch.autograd.grad(out, (q, k, v), dout)


def check_compiled(cfg, api, device, dtype, backend):
    fn = (flash_fn if api == "flash_attn_func" else sdpa_fn)(cfg)
    q, k, v, dout = make_inputs(cfg, dtype, device)
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    c_out, c_lse, *c_grads = run_and_grad(compiled, q, k, v, dout)
    e_out, e_lse, *e_grads = run_and_grad(fn, q, k, v, dout)
    # the compiled graph runs the same kernels: it must match eager to the dtype's threshold ...
    assert_close("out (compiled vs eager)", c_out, e_out, OUT_TOL[dtype])
    if e_lse is not None:
        assert_lse_close(c_lse, e_lse, OUT_TOL[dtype])
    for name, c, e in zip(("dq", "dk", "dv"), c_grads, e_grads):
        assert_close(f"{name} (compiled vs eager)", c, e, grad_tol(dtype))
    # ... and the reference
    ref_out, _, *ref_grads = reference_with_grads(q, k, v, dout, cfg.scale, cfg.causal,
                                                  bottom_right=api == "flash_attn_func")
    assert_close("out", c_out, ref_out, OUT_TOL[dtype])
    for name, c, r in zip(("dq", "dk", "dv"), c_grads, ref_grads):
        assert_close(name, c, r, grad_tol(dtype))


@pytest.mark.parametrize("api", ["flash_attn_func", "sdpa"])
@pytest.mark.parametrize("cfg", SMOKE, ids=lambda c: c.id)
@pytest.mark.parametrize("device, dtype", device_dtype_params([("cpu", torch.float32), ("cuda", torch.bfloat16)]))
def test_compile_aot_eager(device, dtype, cfg, api):
    check_compiled(cfg, api, device, dtype, "aot_eager")


@pytest.mark.parametrize("device, dtype", device_dtype_params([("cpu", torch.float32), ("cuda", torch.bfloat16)]))
def test_compile_dynamic_shapes(device, dtype):
    """dynamic=True: the fake kernels work with symbolic sizes; two sequence lengths, one graph."""
    torch._dynamo.reset()
    base = Cfg(2, 33, 47, 4, 2, 16, causal=True)
    fn = flash_fn(base)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager", dynamic=True)
    for sq, sk in ((33, 47), (20, 61), (61, 20)):
        cfg = Cfg(2, sq, sk, 4, 2, 16, causal=True)
        q, k, v, dout = make_inputs(cfg, dtype, device)
        c_out, c_lse, *c_grads = run_and_grad(compiled, q, k, v, dout)
        ref_out, ref_lse, *ref_grads = reference_with_grads(q, k, v, dout, None, True)
        assert_close("out", c_out, ref_out, OUT_TOL[dtype])
        assert_lse_close(c_lse, ref_lse, OUT_TOL[dtype])
        for name, c, r in zip(("dq", "dk", "dv"), c_grads, ref_grads):
            assert_close(name, c, r, grad_tol(dtype))


@pytest.mark.parametrize("device, dtype", device_dtype_params([("cpu", torch.float32), ("cuda", torch.bfloat16)]))
def test_compile_inductor(device, dtype):
    """The default backend (inductor) around the op, with pointwise work for it to generate code for
    (~20 s on 2 CPU cores with a cold inductor cache, so not marked slow)."""
    cfg = Cfg(2, 65, 127, 6, 2, 32, scale=0.125, layout="mixed")
    q, k, v, dout = make_inputs(cfg, dtype, device)

    def fn(q, k, v):
        out = flashattn_ext.flash_attn_func(q * 1.5, k, torch.tanh(v), softmax_scale=cfg.scale, causal=True)
        return out * 2.0 + 1.0

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    c_out = compiled(q, k, v)
    c_grads = torch.autograd.grad(c_out, (q, k, v), dout)
    e_out = fn(q, k, v)
    e_grads = torch.autograd.grad(e_out, (q, k, v), dout)
    assert_close("out (inductor vs eager)", c_out, e_out, OUT_TOL[dtype])
    for name, c, e in zip(("dq", "dk", "dv"), c_grads, e_grads):
        assert_close(f"{name} (inductor vs eager)", c, e, grad_tol(dtype))


@pytest.mark.parametrize("device, dtype", device_dtype_params([("cpu", torch.float32), ("cuda", torch.bfloat16)]))
def test_compile_kvcache_decode_inductor(device, dtype):
    """Inductor around flash_attn_with_kvcache's decode steps (rotary in torch ops, the append by the mutating op
    kv_append, the attention): one graph for every step (cache_seqlens advances as a tensor), the caches written in
    place and the outputs as eager's."""
    batch, rows, page, nheads, nheads_kv, d = 2, 64, 16, 4, 2, 32
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)

    def step(q, k_cache, v_cache, k, v, cos, sin, seqlens, table):
        out = flashattn_ext.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cos, sin, cache_seqlens=seqlens,
                                                    block_table=table, causal=True)
        return out * 2.0

    angles = torch.arange(rows, dtype=torch.float32)[:, None] * torch.rand(d // 4, generator=gen)
    cos, sin = angles.cos().to(device), angles.sin().to(device)
    table = torch.randperm(batch * rows // page, generator=gen).view(batch, rows // page).to(torch.int32).to(device)
    caches = {name: rnd(batch * rows // page, page, nheads_kv, d) for name in ("k", "v")}
    eager_caches = {name: x.clone() for name, x in caches.items()}
    initial = {name: x.clone() for name, x in caches.items()}
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(step, fullgraph=True, backend=counter)
    seqlens = torch.tensor([3, 40], dtype=torch.int32, device=device)
    for _ in range(3):
        q, k, v = rnd(batch, 1, nheads, d), rnd(batch, 1, nheads_kv, d), rnd(batch, 1, nheads_kv, d)
        c_out = compiled(q, caches["k"], caches["v"], k, v, cos, sin, seqlens, table)
        e_out = step(q, eager_caches["k"], eager_caches["v"], k, v, cos, sin, seqlens, table)
        assert_close("out (inductor vs eager)", c_out, e_out, OUT_TOL[dtype])
        for name in ("k", "v"):
            assert_close(f"{name}_cache (inductor vs eager)", caches[name], eager_caches[name], OUT_TOL[dtype])
        seqlens = seqlens + 1
    assert counter.frame_count == 1, counter.frame_count
    for name in ("k", "v"):  # 3 rows of each sequence appended
        assert (caches[name] != initial[name]).any(dim=(2, 3)).sum() == 3 * batch, name


# ----------------------------------------------------------------------------------------------
# flash_attn_varlen_func: one graph for every max_seqlen (SymInt max_seqlen_q / max_seqlen_k in the schema)
# ----------------------------------------------------------------------------------------------

VARLEN_TOTAL = 16  # every batch packs 2 sequences in 16 tokens: only max_seqlen changes between calls
VARLEN_BATCHES = ([5, 11], [9, 7], [3, 13], [8, 8])  # max_seqlen 11, 9, 13, 8


def varlen_fn(q, k, v, cu_seqlens, max_seqlen):
    return flashattn_ext.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=True,
                                                return_lse=True)


def varlen_batch(lens, dtype, device, seed):
    """q, k, v (VARLEN_TOTAL, 4 / 2 heads, 16) requiring grad, dout, cu_seqlens of lens, max_seqlen."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(VARLEN_TOTAL, h, 16, generator=gen, dtype=torch.float64).to(dtype=dtype,
                                                                                              device=device)
                     for h in (4, 2, 2, 4))
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32, device=device)
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), dout, cu, max(lens)


def varlen_reference(q, k, v, dout, lens):
    """out and dq, dk, dv in float64, sequence by sequence with attention64."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    outs, start = [], 0
    for n in lens:
        rows = slice(start, start + n)
        outs.append(attention64(q64[None, rows], k64[None, rows], v64[None, rows], causal=True)[0][0])
        start += n
    out = torch.cat(outs)
    return (out,) + torch.autograd.grad(out, (q64, k64, v64), dout.double())


def run_varlen(fn, lens, dtype, device, seed):
    q, k, v, dout, cu, max_seqlen = varlen_batch(lens, dtype, device, seed)
    out, lse = fn(q, k, v, cu, max_seqlen)
    return (q, k, v, dout), (out, lse) + torch.autograd.grad(out, (q, k, v), dout)


def check_varlen_compiled(compiled, dtype, device):
    for seed, lens in enumerate(VARLEN_BATCHES):
        inputs, (c_out, c_lse, *c_grads) = run_varlen(compiled, lens, dtype, device, seed)
        _, (e_out, e_lse, *e_grads) = run_varlen(varlen_fn, lens, dtype, device, seed)
        assert_close("out (compiled vs eager)", c_out, e_out, OUT_TOL[dtype])
        assert_lse_close(c_lse, e_lse, OUT_TOL[dtype])
        ref_out, *ref_grads = varlen_reference(*inputs, lens)
        assert_close("out", c_out, ref_out, OUT_TOL[dtype])
        for name, c, e, r in zip(("dq", "dk", "dv"), c_grads, e_grads, ref_grads):
            assert_close(f"{name} (compiled vs eager)", c, e, grad_tol(dtype))
            assert_close(name, c, r, grad_tol(dtype))


@pytest.mark.parametrize("device, dtype", device_dtype_params([("cpu", torch.float32), ("cuda", torch.bfloat16)]))
def test_compile_varlen_max_seqlen_one_graph(device, dtype):
    """dynamic=None (the default): the first call is specialised, as torch.compile does for every int and size
    (automatic dynamic); the second value makes max_seqlen symbolic and that one graph serves every other value
    (the old int schema recompiled for each). dynamic=True: one graph from the start."""
    for dynamic, compiles in ((None, 2), (True, 1)):
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = torch.compile(varlen_fn, fullgraph=True, backend=counter, dynamic=dynamic)
        check_varlen_compiled(compiled, dtype, device)
        assert counter.frame_count == compiles, (dynamic, counter.frame_count)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
@pytest.mark.parametrize("device, dtype", device_dtype_params([("cpu", torch.float32), ("cuda", torch.bfloat16)]))
def test_compile_varlen_max_seqlen_backends(device, dtype, backend):
    """The same through aot_eager and inductor (forward and backward graphs): no recompile past the second
    max_seqlen, results equal to eager and the float64 reference."""
    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(varlen_fn, fullgraph=True, backend=counter)
    check_varlen_compiled(compiled, dtype, device)
    assert counter.frame_count == 2, counter.frame_count
