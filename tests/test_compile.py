"""torch.library.opcheck of the fwd and bwd ops and torch.compile(fullgraph=True) of the public
functions, fed by the SMOKE subset of the one SAMPLES list (with every variant off; the variants'
opcheck and compile tests are in test_variants.py)."""
import pytest
import torch

import flashattn_ext
from fa_testing import (
    DEVICES,
    OUT_TOL,
    SMOKE,
    Cfg,
    Var,
    assert_close,
    assert_lse_close,
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
    out, lse, rng_state = torch.ops.flashattn_ext.fwd(*op_fwd_args(q, k, v, cfg, DENSE, {}))
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
