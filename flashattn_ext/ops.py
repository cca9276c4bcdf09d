"""torch.library registrations for the C++ ops flashattn_ext::fwd, ::bwd, ::dropout_mask and ::kv_append: fake
(meta) kernels with shape checks for tracing, and the autograd formulas of fwd, which save q, k, v, out (its
float32 out32 where the op returns one), lse, the dropout rng_state, the sequence boundaries (varlen) and the
user's own alibi/sink/mask tensors only, and call bwd. bwd has an autograd formula too (double_backward: a
composite over query blocks), and so has the sink's gradient, so that derivatives of any order are exact.
fwd's optional arguments select the call (csrc/ops.cpp): a dense batch; a variable-length batch (cu_seqlens_q
and cu_seqlens_k); a KV cache (cache_seqlens, cache_batch_idx, cache_leftpad, num_splits, or a block_table
without cu_seqlens). A KV cache and a varlen batch with a block_table (a paged KV cache) have no backward (as
flash-attn's): the autograd formula raises."""
import functools
import math
import operator

import torch

from . import _core, double_backward
from ._checks import _lse_dtype
from ._core import PAGE_MULTIPLE

DENSE, VARLEN, CACHE = "dense", "varlen", "cache"


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


def _rounds_fp32(q, rel_bias):
    """Whether the forward computes out in float32 and rounds it (float16 / bfloat16 on the CPU, or with T5's
    rel_bias on CUDA: csrc/ops_cuda.cpp half_on_fp32): then it also returns that float32 out (out32), which its
    autograd saves for the backward's delta (csrc/ops.cpp is_half). With the rounded out instead, the table's
    gradient, a sum of dS over rows whose exact sums cancel, keeps the rounding of every row: bf16, 3% of its
    largest entry (test_fuzz's rel_bias seed 61) where the CPU's is 1e-6."""
    return q.dtype in (torch.float16, torch.bfloat16) and (q.device.type == "cpu" or rel_bias is not None)


def _out32_fake(q, out, rel_bias):
    return out.new_empty(out.shape if _rounds_fp32(q, rel_bias) else (0,), dtype=torch.float32)


def _check_mask_fake(attn_mask, q, k):
    if attn_mask is not None:
        want = (q.shape[0], q.shape[2], q.shape[1], k.shape[1])
        torch._check(
            tuple(attn_mask.shape) == want,
            lambda: f"flashattn_ext: attn_mask must have shape {want}, got {tuple(attn_mask.shape)}",
        )


def _fwd_kind(cu_seqlens_q, cu_seqlens_k, block_table, cache_seqlens, cache_batch_idx, cache_leftpad, num_splits):
    """The call of a fwd from its optional arguments (csrc/ops.cpp fwd_call_kind, which checks them)."""
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        return VARLEN
    if any(t is not None for t in (block_table, cache_seqlens, cache_batch_idx, cache_leftpad)) or num_splits != 0:
        return CACHE
    return DENSE


def _check_kind_fake(kind, bottom_right, attn_mask, dropout_p, rel_bias, cu_seqlens_q, cu_seqlens_k, seqused_k,
                     cache_args):
    """What fwd_call_kind / bwd_call_kind check (csrc/ops.cpp) but max_seqlen_* (symbolic under torch.compile)."""
    torch._check((cu_seqlens_q is None) == (cu_seqlens_k is None),
                 lambda: "flashattn_ext: cu_seqlens_q and cu_seqlens_k go together (a varlen call)")
    torch._check(kind == VARLEN or seqused_k is None,
                 lambda: "flashattn_ext: seqused_k needs cu_seqlens_q and cu_seqlens_k (a varlen call)")
    torch._check(kind != VARLEN or not cache_args,
                 lambda: "flashattn_ext: cache_seqlens, cache_batch_idx, cache_leftpad and num_splits are KV-cache "
                         "arguments, not taken with cu_seqlens_q")
    if kind != DENSE:
        call = ("with cu_seqlens_q (a varlen call)" if kind == VARLEN else
                "with a KV cache (cache_seqlens, cache_batch_idx, cache_leftpad, block_table or num_splits)")
        torch._check(attn_mask is None, lambda: f"flashattn_ext: attn_mask is not supported {call}")
        torch._check(bool(bottom_right), lambda: f"flashattn_ext: bottom_right must be True {call}")
    if kind == CACHE:
        torch._check(dropout_p == 0.0 and rel_bias is None,
                     lambda: "flashattn_ext: dropout_p and rel_bias are not supported with a KV cache")


@torch.library.register_fake("flashattn_ext::fwd")
def _fwd_fake(q, k, v, softmax_scale, causal=False, bottom_right=True, window_left=-1, window_right=-1, softcap=0.0,
              alibi_slopes=None, sink=None, attn_mask=None, dropout_p=0.0, deterministic=False, rel_bias=None,
              rel_buckets=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, max_seqlen_q=0,
              max_seqlen_k=0, block_table=None, cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
              num_splits=0):
    _check_devices_fake(q, k=k, v=v, alibi_slopes=alibi_slopes, sink=sink, attn_mask=attn_mask, rel_bias=rel_bias,
                        rel_buckets=rel_buckets, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                        seqused_k=seqused_k, block_table=block_table, cache_seqlens=cache_seqlens,
                        cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad)
    kind = _fwd_kind(cu_seqlens_q, cu_seqlens_k, block_table, cache_seqlens, cache_batch_idx, cache_leftpad,
                     num_splits)
    cache_args = any(t is not None for t in (cache_seqlens, cache_batch_idx, cache_leftpad)) or num_splits != 0
    _check_kind_fake(kind, bottom_right, attn_mask, dropout_p, rel_bias, cu_seqlens_q, cu_seqlens_k, seqused_k,
                     cache_args)
    rng_state = torch.empty((2,), dtype=torch.int64, device="cpu")
    if kind == VARLEN:
        _check_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table)
        total_q, nheads, _ = q.shape
        out = q.new_empty((total_q, nheads, v.shape[-1]))
        lse = q.new_empty((nheads, total_q), dtype=_lse_dtype(q.dtype))
        return out, lse, rng_state, _out32_fake(q, out, rel_bias)
    if kind == CACHE:
        _check_kvcache_fake(q, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, block_table)
        torch._check(num_splits >= 0, lambda: "flashattn_ext: num_splits must be 0 or a positive count")
    else:
        _check_qkv_fake(q, k, v)
        _check_mask_fake(attn_mask, q, k)
    batch, seqlen_q, nheads, _ = q.shape
    out = q.new_empty((batch, seqlen_q, nheads, v.shape[-1]))
    lse = q.new_empty((batch, nheads, seqlen_q), dtype=_lse_dtype(q.dtype))
    out32 = _out32_fake(q, out, rel_bias) if kind == DENSE else out.new_empty((0,), dtype=torch.float32)
    return out, lse, rng_state, out32


@torch.library.register_fake("flashattn_ext::bwd")
def _bwd_fake(dout, q, k, v, out, lse, rng_state, softmax_scale, causal=False, bottom_right=True, window_left=-1,
              window_right=-1, softcap=0.0, alibi_slopes=None, sink=None, attn_mask=None, dropout_p=0.0,
              deterministic=False, mask_grad=False, rel_bias=None, rel_buckets=None, rel_bias_grad=False,
              cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, max_seqlen_q=0, max_seqlen_k=0):
    _check_devices_fake(q, rng_state, dout=dout, k=k, v=v, out=out, lse=lse, alibi_slopes=alibi_slopes, sink=sink,
                        attn_mask=attn_mask, rel_bias=rel_bias, rel_buckets=rel_buckets, cu_seqlens_q=cu_seqlens_q,
                        cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k)
    kind = VARLEN if cu_seqlens_q is not None or cu_seqlens_k is not None else DENSE
    _check_kind_fake(kind, bottom_right, attn_mask, 0.0, None, cu_seqlens_q, cu_seqlens_k, seqused_k, False)
    lse_dtype = _lse_dtype(q.dtype)
    if kind == VARLEN:
        _check_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k)
        torch._check(lse.shape == (q.shape[1], q.shape[0]),
                     lambda: "flashattn_ext: lse must have shape (nheads, total_q)")
    else:
        _check_qkv_fake(q, k, v)
        _check_mask_fake(attn_mask, q, k)
    _check_out_fake(dout, out, q, v)
    if mask_grad and kind == DENSE:
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
_VARLEN_ARGS = ("cu_seqlens_q", "cu_seqlens_k", "seqused_k", "max_seqlen_q", "max_seqlen_k")

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


def _needs(ctx, i):
    """Whether input i needs a gradient: an input left at its default (not passed, so not among
    ctx.needs_input_grad) never does (None, or a number)."""
    return i < len(ctx.needs_input_grad) and ctx.needs_input_grad[i]


_FWD_AT = {n: i for i, n in enumerate(_core.FWD_ARGS)}
_kind_args = operator.itemgetter(*(_FWD_AT[n] for n in ("cu_seqlens_q", "cu_seqlens_k", "block_table", "cache_seqlens",
                                                        "cache_batch_idx", "cache_leftpad", "num_splits")))
_SAVED_ARGS = ("softmax_scale", "causal", "bottom_right", "window_left", "window_right", "softcap", "dropout_p",
               "deterministic", "max_seqlen_q", "max_seqlen_k")
_saved_args = operator.itemgetter(*(_FWD_AT[n] for n in _SAVED_ARGS))
_saved_inputs = operator.itemgetter(*(_FWD_AT[n] for n in ("k", "v", "alibi_slopes", "sink", "attn_mask", "rel_bias",
                                                             "rel_buckets")))
_varlen_inputs = operator.itemgetter(*(_FWD_AT[n] for n in _VARLEN_ARGS[:3]))
_Q, _BLOCK_TABLE = _FWD_AT["q"], _FWD_AT["block_table"]


def _setup_context(ctx, inputs, output):  # on every recorded call: positions, not a dict of the 26 inputs
    q = inputs[_Q]
    out, lse, rng_state, out32 = output
    ctx.kind = _fwd_kind(*_kind_args(inputs))
    ctx.paged = ctx.kind == CACHE or inputs[_BLOCK_TABLE] is not None
    # rng_state and out32 carry no gradient; nor does a varlen lse (as flash-attn's): its composite would read
    # cu_seqlens on the host, which a traced backward cannot; merge_attention_states refuses such an lse beside
    # an out that requires grad rather than return gradients without lse's part. Unused outputs get None, not
    # zeros: lse's gradient (merging partial attentions) is computed only where one flows.
    ctx.mark_non_differentiable(rng_state, out32, *((lse,) if ctx.kind != DENSE else ()))
    ctx.set_materialize_grads(False)
    if ctx.paged:  # no backward: nothing to save
        return
    varlen = _varlen_inputs(inputs) if ctx.kind == VARLEN else ()
    k, v, alibi_slopes, sink, attn_mask, rel_bias, rel_buckets = _saved_inputs(inputs)
    ctx.save_for_backward(q, k, v, out32 if _rounds_fp32(q, rel_bias) else out, lse, rng_state, alibi_slopes, sink,
                          attn_mask, rel_bias, rel_buckets, *varlen)
    ctx.args = dict(zip(_SAVED_ARGS, _saved_args(inputs)))


def _add_grads(grads, positions, g):
    """grads[positions[name]] += g[name] (None counts as zero)."""
    for n, x in g.items():
        i = positions[n]
        grads[i] = x if grads[i] is None else grads[i] + x


def _backward(ctx, dout, dlse, _drng, _dout32):
    if ctx.paged:
        raise RuntimeError(f"flashattn_ext: attention over a {'KV cache' if ctx.kind == CACHE else 'paged KV cache'} "
                           "(flash_attn_with_kvcache, or varlen with a block_table) has no backward, as flash-attn's; "
                           "use flash_attn_func / flash_attn_varlen_func with k, v tensors for gradients")
    q, k, v, out, lse, rng_state, alibi_slopes, sink, attn_mask, rel_bias, rel_buckets, *varlen = ctx.saved_tensors
    if rel_bias is not None and (dlse is not None or torch.is_grad_enabled()):
        raise NotImplementedError(_REL_UNSUPPORTED)
    args = ctx.args
    var = double_backward.Variant(args["softmax_scale"], args["causal"], args["bottom_right"],
                                  (args["window_left"], args["window_right"]), args["softcap"], args["dropout_p"])
    float_mask = attn_mask is not None and attn_mask.is_floating_point()
    grads = [None] * len(_core.FWD_ARGS)
    if dout is not None:
        mask_grad = float_mask and _needs(ctx, _MASK)
        rel_grad = rel_bias is not None and _needs(ctx, _REL)
        varlen_kw = dict(zip(_VARLEN_ARGS, (*varlen, args["max_seqlen_q"], args["max_seqlen_k"]))) if varlen else {}
        dq, dk, dv, dmask, drel = _core.bwd(
            dout=dout, q=q, k=k, v=v, out=out, lse=lse, rng_state=rng_state, softmax_scale=args["softmax_scale"],
            causal=args["causal"], bottom_right=args["bottom_right"], window_left=args["window_left"],
            window_right=args["window_right"], softcap=args["softcap"], alibi_slopes=alibi_slopes, sink=sink,
            attn_mask=attn_mask, dropout_p=args["dropout_p"], deterministic=args["deterministic"],
            mask_grad=mask_grad, rel_bias=rel_bias, rel_buckets=rel_buckets, rel_bias_grad=rel_grad, **varlen_kw)
        grads[:3] = dq, dk, dv
        if rel_grad:
            grads[_REL] = drel
        if sink is not None and _needs(ctx, _SINK):
            if varlen:
                vjp = functools.partial(_varlen_vjp, *varlen, args["max_seqlen_q"], args["max_seqlen_k"],
                                        alibi_slopes, rng_state, var)
            else:
                vjp = functools.partial(_dense_vjp, alibi_slopes, rng_state, var)
            grads[_SINK] = _differentiable_sink_grad(vjp, dout, out, lse, sink, q, k, v, attn_mask)
        if mask_grad:
            grads[_MASK] = dmask.to(attn_mask.dtype)
    if dlse is not None:  # dense calls only (a varlen lse is not differentiable)
        positions = {"q": _core.FWD_ARGS.index("q"), "k": _core.FWD_ARGS.index("k"), "sink": _SINK, "mask": _MASK}
        needs = [n for n, i in positions.items() if _needs(ctx, i) and (n != "mask" or float_mask)]
        _add_grads(grads, positions, double_backward.lse_vjp(q, k, alibi_slopes, sink, attn_mask, var, dlse, needs,
                                                             torch.is_grad_enabled()))
    return tuple(grads)


torch.library.register_autograd("flashattn_ext::fwd", _backward, setup_context=_setup_context)
_core._FwdRecorder.setup_fn, _core._FwdRecorder.backward_fn = _setup_context, _backward  # eager calls (_core.fwd)
_core._FwdTransformed.setup_fn, _core._FwdTransformed.backward_fn = _setup_context, _backward  # torch.func


# Positions of bwd's differentiable inputs, by double_backward's names.
_BWD_GRAD = {n: _core.BWD_ARGS.index(arg) for n, arg in
             (("dout", "dout"), ("q", "q"), ("k", "k"), ("v", "v"), ("sink", "sink"), ("mask", "attn_mask"))}


def _bwd_setup_context(ctx, inputs, output):
    a = dict(zip(_core.BWD_ARGS, inputs))
    ctx.rel_bias = a["rel_bias"] is not None
    ctx.varlen = a["cu_seqlens_q"] is not None
    varlen = tuple(a[n] for n in _VARLEN_ARGS[:3]) if ctx.varlen else ()
    ctx.save_for_backward(*(a[n] for n in ("dout", "q", "k", "v", "rng_state", "alibi_slopes", "sink", "attn_mask")),
                          *varlen)
    ctx.var = double_backward.Variant(a["softmax_scale"], a["causal"], a["bottom_right"],
                                      (a["window_left"], a["window_right"]), a["softcap"], a["dropout_p"])
    ctx.mask_grad = a["mask_grad"]
    ctx.max_seqlen = (a["max_seqlen_q"], a["max_seqlen_k"])


def _bwd_backward(ctx, gdq, gdk, gdv, gdmask, _gdrel):
    """The gradients of dout, q, k, v, sink and a floating attn_mask from those of dq, dk, dv, dmask (none
    for out and lse: the composite recomputes them from q, k, v, sink and attn_mask). Exact when out, lse
    and rng_state are fwd's for these inputs, as fwd's autograd passes them."""
    if ctx.rel_bias:
        raise NotImplementedError(_REL_UNSUPPORTED)
    if not _core._compiling() and _core._transforms_active():  # the composite makes leaves that require grad
        raise NotImplementedError("flashattn_ext: second derivatives under torch.func transforms (grad of grad, "
                                  "jacrev of jacrev, hessian) are not supported; torch.autograd.grad with "
                                  "create_graph=True gives them")
    dout, q, k, v, rng_state, alibi_slopes, sink, attn_mask, *varlen = ctx.saved_tensors
    float_mask = attn_mask is not None and attn_mask.is_floating_point()
    needs = [n for n, i in _BWD_GRAD.items() if _needs(ctx, i) and (n != "mask" or float_mask)]
    cotangents = {"q": gdq, "k": gdk, "v": gdv, "mask": gdmask if ctx.mask_grad else None}
    if ctx.varlen:
        g = _varlen_vjp(*varlen, *ctx.max_seqlen, alibi_slopes, rng_state, ctx.var, q, k, v, dout, sink, None,
                        cotangents, needs, torch.is_grad_enabled())
    else:
        g = _dense_vjp(alibi_slopes, rng_state, ctx.var, q, k, v, dout, sink, attn_mask, cotangents, needs,
                       torch.is_grad_enabled())
    grads = [None] * len(_core.BWD_ARGS)
    for n, i in _BWD_GRAD.items():
        grads[i] = g.get(n)
    return tuple(grads)


torch.library.register_autograd("flashattn_ext::bwd", _bwd_backward, setup_context=_bwd_setup_context)
_core._BwdTransformed.setup_fn, _core._BwdTransformed.backward_fn = _bwd_setup_context, _bwd_backward  # torch.func


# ------------------------------------------------------------------------------------------------
# Variable-length batches: q (total_q, nheads, headdim), k / v (total_k, nheads_kv, headdim / headdim_v), sequence s
# in rows cu_seqlens_q[s]:cu_seqlens_q[s + 1] of q and from cu_seqlens_k[s] on in k / v; or (with a
# block_table) k / v a paged cache (num_pages, page_size, nheads_kv, headdim), sequence s's keys its first
# cu_seqlens_k[s + 1] - cu_seqlens_k[s] rows through block_table (batch, max_pages) row s.
# KV cache (flash_attn_with_kvcache): q (batch, seqlen_q, nheads, headdim); k / v the caches (batch_cache,
# seqlen_cache, nheads_kv, headdim / headdim_v), or paged (num_pages, page_size, nheads_kv, headdim) with
# block_table (batch, max_pages). Forward only.
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


def _varlen_vjp(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, alibi_slopes, rng_state, var, q, k,
                v, dout, sink, attn_mask, cotangents, needs, create_graph):
    return double_backward.varlen_vjp(q, k, v, dout, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                                      max_seqlen_k, alibi_slopes, sink, rng_state, var, cotangents, needs,
                                      create_graph)



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
