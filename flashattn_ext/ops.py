"""torch.library registrations for the C++ ops flashattn_ext::fwd, ::bwd, ::dropout_mask, ::varlen_fwd,
::varlen_bwd, ::kvcache_fwd and ::kv_append: fake (meta) kernels with shape checks for tracing, and the autograd
formulas of fwd and varlen_fwd, which save q, k, v, out, lse, the dropout rng_state, the sequence
boundaries (varlen) and the user's own alibi/sink/mask tensors only, and call bwd / varlen_bwd.
bwd and varlen_bwd have autograd formulas too (double_backward: a composite over query blocks), and so
has the sink's gradient, so that derivatives of any order are exact.
kvcache_fwd and varlen_fwd with a block_table (a paged KV cache) have no backward (as flash-attn's):
their autograd formulas raise."""
import functools
import math

import torch

from . import _core, double_backward
from ._checks import _lse_dtype
from ._core import PAGE_MULTIPLE


def _check_rank(name, t, rank):
    torch._check(t.dim() == rank, lambda: f"flashattn_ext: {name} must have {rank} dimensions, got {t.dim()}")


def _check_rank4(name, t):
    _check_rank(name, t, 4)


def _check_devices_fake(q, rng_state=None, **tensors):
    """Every tensor argument (None: absent) on q's device, rng_state on the CPU (or on q's device, meta). A meta
    tensor beside real ones dispatches the op here, to its fake kernel, which would return uninitialised memory
    on q's device: it raises instead. All arguments on one device (meta, or torch.compile's fake tensors) pass."""
    for name, t in tensors.items():
        if t is not None:
            torch._check(t.device == q.device,
                         lambda: f"flashattn_ext: {name} must be on the device of q ({q.device}), got {t.device}")
    if rng_state is not None:
        torch._check(rng_state.device.type == "cpu" or rng_state.device == q.device,
                     lambda: f"flashattn_ext: rng_state must be on the CPU (device cpu), got {rng_state.device}")


def _check_qkv_fake(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_rank4(name, t)
    torch._check(k.shape[0] == q.shape[0] and v.shape[0] == q.shape[0], lambda: "flashattn_ext: batch sizes differ")
    torch._check(k.shape[1] == v.shape[1], lambda: "flashattn_ext: seqlen of k and v differ")
    torch._check(k.shape[2] == v.shape[2], lambda: "flashattn_ext: nheads of k and v differ")
    torch._check(k.shape[3] == q.shape[3], lambda: "flashattn_ext: head dims of q and k differ")


def _check_out_fake(dout, out, q, v):
    """dout and out of a backward: q's shape with v's head dim."""
    want = (*q.shape[:-1], v.shape[-1])
    for name, t in (("dout", dout), ("out", out)):
        torch._check(t.shape == want,
                     lambda: f"flashattn_ext: {name} must have the shape of q with the head dim of v {want}")


def _rounds_fp32(q):
    """Whether the forward computes out in float32 and rounds it (float16 / bfloat16 on the CPU): then it also
    returns that float32 out (out32), which its autograd saves for the backward (csrc/ops.cpp is_half)."""
    return q.device.type == "cpu" and q.dtype in (torch.float16, torch.bfloat16)


def _out32_fake(q, out):
    return out.new_empty(out.shape if _rounds_fp32(q) else (0,), dtype=torch.float32)


def _check_mask_fake(attn_mask, q, k):
    if attn_mask is not None:
        want = (q.shape[0], q.shape[2], q.shape[1], k.shape[1])
        torch._check(
            tuple(attn_mask.shape) == want,
            lambda: f"flashattn_ext: attn_mask must have shape {want}, got {tuple(attn_mask.shape)}",
        )


@torch.library.register_fake("flashattn_ext::fwd")
def _fwd_fake(q, k, v, softmax_scale, causal, bottom_right, window_left, window_right, softcap, alibi_slopes, sink,
              attn_mask, dropout_p, deterministic, rel_bias=None, rel_buckets=None):
    _check_devices_fake(q, k=k, v=v, alibi_slopes=alibi_slopes, sink=sink, attn_mask=attn_mask, rel_bias=rel_bias,
                        rel_buckets=rel_buckets)
    _check_qkv_fake(q, k, v)
    _check_mask_fake(attn_mask, q, k)
    batch, seqlen_q, nheads, _ = q.shape
    out = q.new_empty((batch, seqlen_q, nheads, v.shape[-1]))
    lse = q.new_empty((batch, nheads, seqlen_q), dtype=_lse_dtype(q.dtype))
    rng_state = torch.empty((2,), dtype=torch.int64, device="cpu")
    return out, lse, rng_state, _out32_fake(q, out)


@torch.library.register_fake("flashattn_ext::bwd")
def _bwd_fake(dout, q, k, v, out, lse, rng_state, softmax_scale, causal, bottom_right, window_left, window_right,
              softcap, alibi_slopes, sink, attn_mask, dropout_p, deterministic, mask_grad, rel_bias=None,
              rel_buckets=None, rel_bias_grad=False):
    _check_devices_fake(q, rng_state, dout=dout, k=k, v=v, out=out, lse=lse, alibi_slopes=alibi_slopes, sink=sink,
                        attn_mask=attn_mask, rel_bias=rel_bias, rel_buckets=rel_buckets)
    _check_qkv_fake(q, k, v)
    _check_mask_fake(attn_mask, q, k)
    _check_out_fake(dout, out, q, v)
    lse_dtype = _lse_dtype(q.dtype)
    if mask_grad:
        dmask = q.new_empty((q.shape[0], q.shape[2], q.shape[1], k.shape[1]), dtype=lse_dtype)
    else:
        dmask = q.new_empty((0,), dtype=lse_dtype)
    drel = q.new_empty(rel_bias.shape if rel_bias_grad else (0,), dtype=lse_dtype)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dmask, drel


@torch.library.register_fake("flashattn_ext::dropout_mask")
def _dropout_mask_fake(q, rng_state, seqlen_k, dropout_p):
    _check_devices_fake(q, rng_state)
    _check_rank4("q", q)
    return q.new_empty((q.shape[0], q.shape[2], q.shape[1], seqlen_k), dtype=torch.bool)


# Positions of fwd's inputs.
_SINK, _MASK, _REL = (_core.FWD_ARGS.index(n) for n in ("sink", "attn_mask", "rel_bias"))

_REL_UNSUPPORTED = ("flashattn_ext: rel_bias supports the first-order gradients of q, k, v, sink and rel_bias; the "
                    "gradient of lse and double backward (create_graph=True) through it are not supported yet")


def _sink_grad(dout, out, lse, sink):
    """d sink_h = -sum over rows of P_sink * delta, P_sink = exp(sink_h - lse), delta = rowsum(dO * O), for
    dout / out (..., rows, nheads, headdim_v) and lse (..., nheads, rows): dense (batch, seqlen_q, ...) or
    varlen (total_q, ...). A row with lse = -inf (a varlen row of no sequence: out 0, delta 0) adds nothing."""
    delta = (dout.to(lse.dtype) * out.to(lse.dtype)).sum(-1).transpose(-1, -2)  # lse's shape
    p_sink = torch.where(lse == -math.inf, torch.zeros((), dtype=lse.dtype, device=lse.device),
                         torch.exp(sink.view(-1, 1) - lse))
    return -(p_sink * delta).transpose(0, -2).reshape(sink.shape[0], -1).sum(1)


class _SinkGrad(torch.autograd.Function):
    """_sink_grad(dout, out, lse, sink) differentiable in full: lse, which _sink_grad takes as a constant, is
    a function of q, k, v, sink and attn_mask, so its backward is the composite's (vjp: the dense or varlen
    double_backward function with the call's other arguments bound) and out / lse get no gradient."""

    @staticmethod
    def forward(ctx, vjp, dout, out, lse, sink, q, k, v, attn_mask):
        ctx.vjp = vjp
        ctx.save_for_backward(dout, sink, q, k, v, attn_mask)
        return _sink_grad(dout, out, lse, sink)

    @staticmethod
    def backward(ctx, gsink):
        dout, sink, q, k, v, attn_mask = ctx.saved_tensors
        names = ("dout", None, None, "sink", "q", "k", "v", "mask")
        needs = [n for n, need in zip(names, ctx.needs_input_grad[1:]) if n is not None and need]
        g = ctx.vjp(q, k, v, dout, sink, attn_mask, {"sink": gsink}, needs, torch.is_grad_enabled())
        return (None,) + tuple(None if n is None else g.get(n) for n in names)


def _differentiable_sink_grad(vjp, dout, out, lse, sink, q, k, v, attn_mask):
    """_sink_grad, through _SinkGrad when a graph is being recorded (a backward with create_graph)."""
    if torch.is_grad_enabled():
        return _SinkGrad.apply(vjp, dout, out, lse, sink, q, k, v, attn_mask)
    return _sink_grad(dout, out, lse, sink)


def _dense_vjp(alibi_slopes, rng_state, var, q, k, v, dout, sink, attn_mask, cotangents, needs, create_graph):
    keep = double_backward.dense_keep(q, rng_state, k.shape[1], var.dropout_p)
    return double_backward.attention_vjp(q, k, v, dout, alibi_slopes, sink, attn_mask, keep, var, cotangents, needs,
                                         create_graph)


def _setup_context(ctx, inputs, output):
    (q, k, v, softmax_scale, causal, bottom_right, window_left, window_right, softcap, alibi_slopes, sink, attn_mask,
     dropout_p, deterministic, rel_bias, rel_buckets) = inputs
    out, lse, rng_state, out32 = output
    ctx.save_for_backward(q, k, v, out32 if _rounds_fp32(q) else out, lse, rng_state, alibi_slopes, sink, attn_mask,
                          rel_bias, rel_buckets)
    ctx.args = (softmax_scale, causal, bottom_right, window_left, window_right, softcap, dropout_p, deterministic)
    # rng_state and out32 carry no gradient. Unused outputs get None, not zeros: lse's gradient (merging partial
    # attentions) is computed only where one flows.
    ctx.mark_non_differentiable(rng_state, out32)
    ctx.set_materialize_grads(False)


def _add_grads(grads, positions, g):
    """grads[positions[name]] += g[name] (None counts as zero)."""
    for n, x in g.items():
        i = positions[n]
        grads[i] = x if grads[i] is None else grads[i] + x


def _backward(ctx, dout, dlse, _drng, _dout32):
    q, k, v, out, lse, rng_state, alibi_slopes, sink, attn_mask, rel_bias, rel_buckets = ctx.saved_tensors
    if rel_bias is not None and (dlse is not None or torch.is_grad_enabled()):
        raise NotImplementedError(_REL_UNSUPPORTED)
    softmax_scale, causal, bottom_right, window_left, window_right, softcap, dropout_p, deterministic = ctx.args
    var = double_backward.Variant(softmax_scale, causal, bottom_right, (window_left, window_right), softcap, dropout_p)
    float_mask = attn_mask is not None and attn_mask.is_floating_point()
    grads = [None] * len(_core.FWD_ARGS)
    if dout is not None:
        mask_grad = float_mask and ctx.needs_input_grad[_MASK]
        rel_grad = rel_bias is not None and ctx.needs_input_grad[_REL]
        dq, dk, dv, dmask, drel = _core.bwd(
            dout=dout, q=q, k=k, v=v, out=out, lse=lse, rng_state=rng_state, softmax_scale=softmax_scale,
            causal=causal, bottom_right=bottom_right, window_left=window_left, window_right=window_right,
            softcap=softcap, alibi_slopes=alibi_slopes, sink=sink, attn_mask=attn_mask, dropout_p=dropout_p,
            deterministic=deterministic, mask_grad=mask_grad, rel_bias=rel_bias, rel_buckets=rel_buckets,
            rel_bias_grad=rel_grad,
        )
        grads[:3] = dq, dk, dv
        if rel_grad:
            grads[_REL] = drel
        if sink is not None and ctx.needs_input_grad[_SINK]:
            vjp = functools.partial(_dense_vjp, alibi_slopes, rng_state, var)
            grads[_SINK] = _differentiable_sink_grad(vjp, dout, out, lse, sink, q, k, v, attn_mask)
        if mask_grad:
            grads[_MASK] = dmask.to(attn_mask.dtype)
    if dlse is not None:
        positions = {"q": _core.FWD_ARGS.index("q"), "k": _core.FWD_ARGS.index("k"), "sink": _SINK, "mask": _MASK}
        needs = [n for n, i in positions.items() if ctx.needs_input_grad[i] and (n != "mask" or float_mask)]
        _add_grads(grads, positions, double_backward.lse_vjp(q, k, alibi_slopes, sink, attn_mask, var, dlse, needs,
                                                             torch.is_grad_enabled()))
    return tuple(grads)


torch.library.register_autograd("flashattn_ext::fwd", _backward, setup_context=_setup_context)


# Positions of bwd's differentiable inputs, by double_backward's names.
_BWD_GRAD = {n: _core.BWD_ARGS.index(arg) for n, arg in
             (("dout", "dout"), ("q", "q"), ("k", "k"), ("v", "v"), ("sink", "sink"), ("mask", "attn_mask"))}


def _bwd_setup_context(ctx, inputs, output):
    (dout, q, k, v, out, lse, rng_state, softmax_scale, causal, bottom_right, window_left, window_right, softcap,
     alibi_slopes, sink, attn_mask, dropout_p, deterministic, mask_grad, rel_bias, _rel_buckets, _rel_grad) = inputs
    ctx.rel_bias = rel_bias is not None
    ctx.save_for_backward(dout, q, k, v, rng_state, alibi_slopes, sink, attn_mask)
    ctx.var = double_backward.Variant(softmax_scale, causal, bottom_right, (window_left, window_right), softcap,
                                      dropout_p)
    ctx.mask_grad = mask_grad


def _bwd_backward(ctx, gdq, gdk, gdv, gdmask, _gdrel):
    """The gradients of dout, q, k, v, sink and a floating attn_mask from those of dq, dk, dv, dmask (none
    for out and lse: the composite recomputes them from q, k, v, sink and attn_mask). Exact when out, lse
    and rng_state are fwd's for these inputs, as fwd's autograd passes them."""
    if ctx.rel_bias:
        raise NotImplementedError(_REL_UNSUPPORTED)
    dout, q, k, v, rng_state, alibi_slopes, sink, attn_mask = ctx.saved_tensors
    float_mask = attn_mask is not None and attn_mask.is_floating_point()
    needs = [n for n, i in _BWD_GRAD.items() if ctx.needs_input_grad[i] and (n != "mask" or float_mask)]
    cotangents = {"q": gdq, "k": gdk, "v": gdv, "mask": gdmask if ctx.mask_grad else None}
    g = _dense_vjp(alibi_slopes, rng_state, ctx.var, q, k, v, dout, sink, attn_mask, cotangents, needs,
                   torch.is_grad_enabled())
    grads = [None] * len(_core.BWD_ARGS)
    for n, i in _BWD_GRAD.items():
        grads[i] = g.get(n)
    return tuple(grads)


torch.library.register_autograd("flashattn_ext::bwd", _bwd_backward, setup_context=_bwd_setup_context)


# ------------------------------------------------------------------------------------------------
# Variable-length batches: q (total_q, nheads, headdim), k / v (total_k, nheads_kv, headdim / headdim_v), sequence s
# in rows cu_seqlens_q[s]:cu_seqlens_q[s + 1] of q and from cu_seqlens_k[s] on in k / v; or (varlen_fwd
# with a block_table) k / v a paged cache (num_pages, page_size, nheads_kv, headdim), sequence s's keys
# its first cu_seqlens_k[s + 1] - cu_seqlens_k[s] rows through block_table (batch, max_pages) row s.
# ------------------------------------------------------------------------------------------------

def _check_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table=None):
    _check_rank("q", q, 3)
    kv_rank = 3 if block_table is None else 4
    for name, t in (("k", k), ("v", v)):
        _check_rank(name, t, kv_rank)
    torch._check(k.shape[:-1] == v.shape[:-1],
                 lambda: "flashattn_ext: k and v differ in total_k / pages, page size or nheads")
    torch._check(k.shape[-1] == q.shape[2], lambda: "flashattn_ext: head dims of q and k differ")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        _check_rank(name, t, 1)
    torch._check(cu_seqlens_q.shape[0] >= 2, lambda: "flashattn_ext: cu_seqlens_q must have batch + 1 >= 2 entries")
    torch._check(cu_seqlens_k.shape[0] == cu_seqlens_q.shape[0],
                 lambda: "flashattn_ext: cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1)")
    if seqused_k is not None:
        _check_rank("seqused_k", seqused_k, 1)
        torch._check(seqused_k.shape[0] == cu_seqlens_q.shape[0] - 1,
                     lambda: "flashattn_ext: seqused_k must have shape (batch,)")
    if block_table is not None:
        _check_rank("block_table", block_table, 2)
        torch._check(block_table.shape[0] == cu_seqlens_q.shape[0] - 1 and block_table.shape[1] >= 1,
                     lambda: "flashattn_ext: block_table must have shape (batch, max_pages_per_sequence >= 1)")
        torch._check(k.shape[1] > 0 and k.shape[1] % PAGE_MULTIPLE == 0,
                     lambda: f"flashattn_ext: the page size must be a positive multiple of {PAGE_MULTIPLE}")
        torch._check(k.shape[0] > 0, lambda: "flashattn_ext: a paged k needs at least one page")


@torch.library.register_fake("flashattn_ext::varlen_fwd")
def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                     causal, window_left, window_right, softcap, alibi_slopes, sink, dropout_p, deterministic,
                     block_table=None, rel_bias=None, rel_buckets=None):
    _check_devices_fake(q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
                        alibi_slopes=alibi_slopes, sink=sink, block_table=block_table, rel_bias=rel_bias,
                        rel_buckets=rel_buckets)
    _check_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table)
    total_q, nheads, _ = q.shape
    out = q.new_empty((total_q, nheads, v.shape[-1]))
    lse = q.new_empty((nheads, total_q), dtype=_lse_dtype(q.dtype))
    rng_state = torch.empty((2,), dtype=torch.int64, device="cpu")
    return out, lse, rng_state, _out32_fake(q, out)


@torch.library.register_fake("flashattn_ext::varlen_bwd")
def _varlen_bwd_fake(dout, q, k, v, out, lse, rng_state, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                     max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, sink,
                     dropout_p, deterministic, rel_bias=None, rel_buckets=None, rel_bias_grad=False):
    _check_devices_fake(q, rng_state, dout=dout, k=k, v=v, out=out, lse=lse, cu_seqlens_q=cu_seqlens_q,
                        cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k, alibi_slopes=alibi_slopes, sink=sink,
                        rel_bias=rel_bias, rel_buckets=rel_buckets)
    _check_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k)
    _check_out_fake(dout, out, q, v)
    torch._check(lse.shape == (q.shape[1], q.shape[0]), lambda: "flashattn_ext: lse must have shape (nheads, total_q)")
    drel = q.new_empty(rel_bias.shape if rel_bias_grad else (0,), dtype=_lse_dtype(q.dtype))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), drel


# Positions of varlen_fwd's sink and rel_bias.
_VARLEN_SINK, _VARLEN_REL = (_core.VARLEN_FWD_ARGS.index(n) for n in ("sink", "rel_bias"))


def _varlen_setup_context(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
     window_right, softcap, alibi_slopes, sink, dropout_p, deterministic, block_table, rel_bias, rel_buckets) = inputs
    out, lse, rng_state, out32 = output
    # lse carries no gradient here (as flash-attn's; fwd's does): its composite would read cu_seqlens on the
    # host, which a traced backward cannot. merge_attention_states refuses such an lse beside an out that
    # requires grad rather than return gradients without lse's part.
    ctx.mark_non_differentiable(lse, rng_state, out32)
    ctx.paged = block_table is not None
    if ctx.paged:  # no backward: nothing to save
        return
    ctx.save_for_backward(q, k, v, out32 if _rounds_fp32(q) else out, lse, rng_state, cu_seqlens_q, cu_seqlens_k,
                          seqused_k, alibi_slopes, sink, rel_bias, rel_buckets)
    ctx.args = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, dropout_p,
                deterministic)


def _varlen_backward(ctx, dout, _dlse, _drng, _dout32):
    if ctx.paged:
        raise RuntimeError("flashattn_ext: varlen_fwd with a block_table (a paged KV cache) has no backward, as "
                           "flash-attn's; pass k and v as (total_k, nheads_kv, headdim) tensors for gradients")
    (q, k, v, out, lse, rng_state, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes, sink, rel_bias,
     rel_buckets) = ctx.saved_tensors
    if rel_bias is not None and torch.is_grad_enabled():
        raise NotImplementedError(_REL_UNSUPPORTED)
    (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, dropout_p,
     deterministic) = ctx.args
    grads = [None] * len(_core.VARLEN_FWD_ARGS)
    rel_grad = rel_bias is not None and ctx.needs_input_grad[_VARLEN_REL]
    dq, dk, dv, drel = _core.varlen_bwd(
        dout=dout, q=q, k=k, v=v, out=out, lse=lse, rng_state=rng_state, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
        softmax_scale=softmax_scale, causal=causal, window_left=window_left, window_right=window_right,
        softcap=softcap, alibi_slopes=alibi_slopes, sink=sink, dropout_p=dropout_p, deterministic=deterministic,
        rel_bias=rel_bias, rel_buckets=rel_buckets, rel_bias_grad=rel_grad,
    )
    grads[:3] = dq, dk, dv
    if rel_grad:
        grads[_VARLEN_REL] = drel
    if sink is not None and ctx.needs_input_grad[_VARLEN_SINK]:
        var = double_backward.Variant(softmax_scale, causal, True, (window_left, window_right), softcap, dropout_p)
        vjp = functools.partial(_varlen_vjp, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                                alibi_slopes, rng_state, var)
        grads[_VARLEN_SINK] = _differentiable_sink_grad(vjp, dout, out, lse, sink, q, k, v, None)
    return tuple(grads)


torch.library.register_autograd("flashattn_ext::varlen_fwd", _varlen_backward, setup_context=_varlen_setup_context)


def _varlen_vjp(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, alibi_slopes, rng_state, var, q, k,
                v, dout, sink, attn_mask, cotangents, needs, create_graph):
    return double_backward.varlen_vjp(q, k, v, dout, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                                      max_seqlen_k, alibi_slopes, sink, rng_state, var, cotangents, needs,
                                      create_graph)


# Positions of varlen_bwd's differentiable inputs.
_VARLEN_BWD_GRAD = {n: _core.VARLEN_BWD_ARGS.index(n) for n in ("dout", "q", "k", "v", "sink")}


def _varlen_bwd_setup_context(ctx, inputs, output):
    (dout, q, k, v, out, lse, rng_state, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
     softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, sink, dropout_p, deterministic, rel_bias,
     _rel_buckets, _rel_grad) = inputs
    ctx.rel_bias = rel_bias is not None
    ctx.save_for_backward(dout, q, k, v, rng_state, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes, sink)
    ctx.args = (max_seqlen_q, max_seqlen_k,
                double_backward.Variant(softmax_scale, causal, True, (window_left, window_right), softcap, dropout_p))


def _varlen_bwd_backward(ctx, gdq, gdk, gdv, _gdrel):
    """varlen_bwd's gradients of dout, q, k, v and sink (none for out and lse, as _bwd_backward)."""
    if ctx.rel_bias:
        raise NotImplementedError(_REL_UNSUPPORTED)
    dout, q, k, v, rng_state, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes, sink = ctx.saved_tensors
    max_seqlen_q, max_seqlen_k, var = ctx.args
    needs = [n for n, i in _VARLEN_BWD_GRAD.items() if ctx.needs_input_grad[i]]
    g = _varlen_vjp(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, alibi_slopes, rng_state, var,
                    q, k, v, dout, sink, None, {"q": gdq, "k": gdk, "v": gdv}, needs, torch.is_grad_enabled())
    grads = [None] * len(_core.VARLEN_BWD_ARGS)
    for n, i in _VARLEN_BWD_GRAD.items():
        grads[i] = g.get(n)
    return tuple(grads)


torch.library.register_autograd("flashattn_ext::varlen_bwd", _varlen_bwd_backward,
                                setup_context=_varlen_bwd_setup_context)


# ------------------------------------------------------------------------------------------------
# KV cache (flash_attn_with_kvcache): q (batch, seqlen_q, nheads, headdim); k_cache / v_cache
# (batch_cache, seqlen_cache, nheads_kv, headdim / headdim_v), or paged (num_pages, page_size, nheads_kv, headdim)
# with block_table (batch, max_pages). Forward only.
# ------------------------------------------------------------------------------------------------


def _check_kvcache_fake(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table):
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check_rank4(name, t)
    torch._check(k_cache.shape[0] == v_cache.shape[0] and k_cache.shape[1] == v_cache.shape[1]
                 and k_cache.shape[2] == v_cache.shape[2],
                 lambda: "flashattn_ext: k_cache and v_cache must have the same shape but for the head dim")
    torch._check(k_cache.shape[3] == q.shape[3], lambda: "flashattn_ext: head dims of q and k_cache differ")
    batch = q.shape[0]
    for name, t in (("cache_seqlens", cache_seqlens), ("cache_batch_idx", cache_batch_idx),
                    ("cache_leftpad", cache_leftpad)):
        if t is not None:
            _check_rank(name, t, 1)
            torch._check(t.shape[0] == batch, lambda: f"flashattn_ext: {name} must have shape (batch,)")
    if block_table is not None:
        torch._check(cache_batch_idx is None,
                     lambda: "flashattn_ext: cache_batch_idx cannot be combined with block_table")
        _check_rank("block_table", block_table, 2)
        torch._check(block_table.shape[0] == batch,
                     lambda: "flashattn_ext: block_table must have shape (batch, max_pages_per_sequence)")
        torch._check(k_cache.shape[1] % PAGE_MULTIPLE == 0,
                     lambda: f"flashattn_ext: the page size must be a multiple of {PAGE_MULTIPLE}")
    elif cache_batch_idx is None:
        torch._check(k_cache.shape[0] == batch,
                     lambda: "flashattn_ext: the batch size of k_cache must be that of q without cache_batch_idx")


@torch.library.register_fake("flashattn_ext::kvcache_fwd")
def _kvcache_fwd_fake(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, softmax_scale,
                      causal, window_left, window_right, softcap, alibi_slopes, sink, num_splits=0):
    _check_devices_fake(q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens,
                        cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad, block_table=block_table,
                        alibi_slopes=alibi_slopes, sink=sink)
    _check_kvcache_fake(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table)
    torch._check(num_splits >= 0, lambda: "flashattn_ext: num_splits must be 0 or a positive count")
    batch, seqlen_q, nheads, _ = q.shape
    out = q.new_empty((batch, seqlen_q, nheads, v_cache.shape[-1]))
    lse = q.new_empty((batch, nheads, seqlen_q), dtype=_lse_dtype(q.dtype))
    return out, lse


def _kvcache_backward(ctx, dout, dlse):
    raise RuntimeError("flashattn_ext: kvcache_fwd (flash_attn_with_kvcache) has no backward, as flash-attn's; "
                       "use flash_attn_func for attention that needs gradients")


torch.library.register_autograd("flashattn_ext::kvcache_fwd", _kvcache_backward)


@torch.library.register_fake("flashattn_ext::kv_append")
def _kv_append_fake(k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table):
    """Writes nothing (a fake kernel); checks what the C++ op checks of shapes, dtypes and devices."""
    tensors = dict(v_cache=v_cache, k=k, v=v, cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx,
                   block_table=block_table)
    for name, t in tensors.items():
        if t is not None:
            torch._check(t.device == k_cache.device, lambda: f"flashattn_ext: {name} must be on the device of "
                                                             f"k_cache ({k_cache.device}), got {t.device}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        _check_rank4(name, t)
        torch._check(t.dtype == k_cache.dtype,
                     lambda: f"flashattn_ext: {name} must have the dtype of k_cache ({k_cache.dtype}), got {t.dtype}")
    batch, seqlen_new, nheads_kv = k.shape[0], k.shape[1], k_cache.shape[2]
    torch._check(v_cache.shape[:3] == k_cache.shape[:3],
                 lambda: "flashattn_ext: v_cache must have the shape of k_cache but for its head dim")
    torch._check(k.shape[2:] == k_cache.shape[2:],
                 lambda: "flashattn_ext: k must have the nheads_kv and headdim of k_cache")
    torch._check(v.shape == (batch, seqlen_new, nheads_kv, v_cache.shape[3]),
                 lambda: "flashattn_ext: v must have k's batch and seqlen_new, v_cache's nheads_kv and head dim")
    for name, t in (("cache_seqlens", cache_seqlens), ("cache_batch_idx", cache_batch_idx)):
        if t is not None:
            torch._check(t.dtype == torch.int32, lambda: f"flashattn_ext: {name} must be int32, got {t.dtype}")
            torch._check(t.shape == (batch,), lambda: f"flashattn_ext: {name} must have shape (batch,) = ({batch},)")
    if block_table is not None:
        torch._check(cache_batch_idx is None,
                     lambda: "flashattn_ext: cache_batch_idx cannot be combined with block_table")
        torch._check(block_table.dtype == torch.int32, lambda: "flashattn_ext: block_table must be int32")
        _check_rank("block_table", block_table, 2)
        torch._check(block_table.shape[0] == batch,
                     lambda: "flashattn_ext: block_table must have shape (batch, max_pages_per_sequence)")
        torch._check(k_cache.shape[1] > 0 and k_cache.shape[1] % PAGE_MULTIPLE == 0,
                     lambda: f"flashattn_ext: the page size must be a positive multiple of {PAGE_MULTIPLE}")
    elif cache_batch_idx is None:
        torch._check(k_cache.shape[0] == batch,
                     lambda: "flashattn_ext: the batch size of k_cache must be that of k without cache_batch_idx")
