"""The op contract: the only module that calls the C++ ops torch.ops.flashattn_ext.* (schemas in csrc/ops.cpp) and
the extension's limits().
One wrapper per op (fwd, bwd, dropout_mask, kv_append), its parameters keyword-only and named as the schema's
arguments, calls the op positionally in schema order; varlen_fwd, varlen_bwd and kvcache_fwd name the calls of
fwd / bwd that the package makes with a variable-length batch or a KV cache. *_ARGS are the schemas' argument
names in order, read from the registered ops: ops.py takes the input positions of its autograd formulas from them."""
import torch

from . import _C  # registers torch.ops.flashattn_ext.*

LIMITS = _C.limits()  # what the kernels of this build take (csrc/ops.cpp limits())
PAGE_MULTIPLE = LIMITS["page_multiple"]  # page sizes of a paged KV cache are multiples of it


def _arg_names(op):
    return tuple(a.name for a in getattr(torch.ops.flashattn_ext, op).default._schema.arguments)


FWD_ARGS = _arg_names("fwd")
BWD_ARGS = _arg_names("bwd")
DROPOUT_MASK_ARGS = _arg_names("dropout_mask")
KV_APPEND_ARGS = _arg_names("kv_append")


def fwd(*, q, k, v, softmax_scale, causal=False, bottom_right=True, window_left=-1, window_right=-1, softcap=0.0,
        alibi_slopes=None, sink=None, attn_mask=None, dropout_p=0.0, deterministic=False, rel_bias=None,
        rel_buckets=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, max_seqlen_q=0, max_seqlen_k=0,
        block_table=None, cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, num_splits=0):
    """The one forward: a dense batch, a varlen batch (cu_seqlens_q / _k given) or a KV cache (cache_* /
    num_splits, or block_table without cu_seqlens), as the schema says (csrc/ops.cpp) -> (out, lse, rng_state)
    (the op's out32 is for its autograd, ops.py)."""
    args = (q, k, v, softmax_scale, causal, bottom_right, window_left, window_right, softcap, alibi_slopes, sink,
            attn_mask, dropout_p, deterministic, rel_bias, rel_buckets, cu_seqlens_q, cu_seqlens_k, seqused_k,
            max_seqlen_q, max_seqlen_k, block_table, cache_seqlens, cache_batch_idx, cache_leftpad, num_splits)
    grads = (q, k, v, alibi_slopes, sink, attn_mask, rel_bias)
    return _dispatch(torch.ops.flashattn_ext.fwd.default, _FwdTransformed, _FwdRecorder, args, grads)[:3]


class _FwdRecorder(torch.autograd.Function):
    """The fwd op under the autograd formula that ops.py registers for it (ops.py sets setup_fn and backward_fn),
    applied directly: fwd takes it in eager mode when a graph is recorded. Through the op's registered autograd,
    torch fills the schema's defaults on every such call (torch/_library/utils.py fill_defaults reads
    schema.arguments anew for each argument): ~150 us of Python for fwd's 26 arguments, more than the kernel up to
    s2k on an H200. torch.compile traces the op with its registered autograd instead."""
    setup_fn = backward_fn = None

    @staticmethod
    def forward(ctx, *args):  # no setup_context staticmethod: torch would bind the defaults of such a forward per call
        with _BelowAutograd():  # this Function records the graph: the op's own autograd is skipped
            output = torch.ops.flashattn_ext.fwd.default(*args)
        _FwdRecorder.setup_fn(ctx, args, output)
        return output

    @staticmethod
    def backward(ctx, *grads):
        return _FwdRecorder.backward_fn(ctx, *grads)


class _Transformed(torch.autograd.Function):
    """An op under its registered autograd formula (ops.py sets setup_fn and backward_fn of the subclasses) in
    the form torch.func's transforms take, which torch's register_autograd wrapper is not: a setup_context
    staticmethod, and a vmap rule generated from the op's per-sample fallback. So torch.func.grad / vjp / jacrev
    and vmap of them run on the kernels (second derivatives under a transform raise: ops._bwd_backward). Taken
    only while a transform is active (fwd / bwd below), where no jvp level is (_no_forward_ad)."""
    generate_vmap_rule = True
    op = setup_fn = backward_fn = None

    @classmethod
    def forward(cls, *args):
        with _BelowAutograd():  # this Function is the autograd
            return cls.op(*args)

    @classmethod
    def setup_context(cls, ctx, inputs, output):
        cls.setup_fn(ctx, inputs, output)

    @classmethod
    def backward(cls, ctx, *grads):
        return cls.backward_fn(ctx, *grads)


class _FwdTransformed(_Transformed):
    op = torch.ops.flashattn_ext.fwd.default


class _BwdTransformed(_Transformed):
    op = torch.ops.flashattn_ext.bwd.default


_compiling = getattr(torch.compiler, "is_compiling", lambda: False)
# Eager calls that record no graph skip the ops' registered autograd (torch/_library/autograd.py), whose Python
# wrapper only redispatches below autograd in that case but costs ~10 us of host time per call (at s512 more than
# an H200 kernel): the same redispatch, done here. Not while torch.compile traces, a torch.func transform or a
# forward-mode AD level is active (dual tensors: the op's autograd raises for them, which must stay so).
_BelowAutograd = torch._C._AutoDispatchBelowAutograd
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: True)


_forward_ad = torch.autograd.forward_ad


def _dispatch(op, transformed, recorder, args, tensors):
    """op(*args) the way the call needs, each condition read once (host time: every call pays this):
    - forward-mode AD with tangents among tensors raises (_no_forward_ad);
    - a torch.func transform: the op under transformed (its vmap / grad form);
    - eager, a graph recorded (grad mode on, some tensor requires grad): through recorder where given (the fwd op's
      _FwdRecorder), else the op's registered autograd;
    - eager, nothing recorded, no forward-mode AD level: straight below autograd (see _BelowAutograd);
    - a torch.compile trace: the op with its registered autograd."""
    if _compiling():
        _no_forward_ad(tensors)
        return op(*args)
    level, transforms = _forward_ad._current_level, _transforms_active()
    if level >= 0 or transforms:
        _no_forward_ad(tensors)
        if transforms:
            return transformed.apply(*args)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        if recorder is not None and recorder.setup_fn is not None:
            return recorder.apply(*args)
    elif level < 0:
        with _BelowAutograd():
            return op(*args)
    return op(*args)


def _no_forward_ad(tensors):
    """Forward-mode AD (dual tensors of torch.autograd.forward_ad, torch.func.jvp / jacfwd / hessian) has no
    formula here: raise rather than let the ops return outputs without tangents (zero directional derivatives)."""
    level = torch.autograd.forward_ad._current_level
    if level >= 0 and any(t is not None and torch.autograd.forward_ad.unpack_dual(t).tangent is not None
                          for t in tensors):
        raise NotImplementedError(_FORWARD_AD)
    if not _compiling() and _transforms_active():
        from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters
        if any(i.key() == torch._C._functorch.TransformType.Jvp for i in retrieve_all_functorch_interpreters()):
            raise NotImplementedError(_FORWARD_AD)


_FORWARD_AD = ("flashattn_ext: forward-mode AD (torch.autograd.forward_ad dual tensors, torch.func.jvp, jacfwd, "
               "hessian) is not supported; reverse mode (backward, torch.autograd.grad, double backward) is")


def bwd(*, dout, q, k, v, out, lse, rng_state, softmax_scale, causal=False, bottom_right=True, window_left=-1,
        window_right=-1, softcap=0.0, alibi_slopes=None, sink=None, attn_mask=None, dropout_p=0.0,
        deterministic=False, mask_grad=False, rel_bias=None, rel_buckets=None, rel_bias_grad=False,
        cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, max_seqlen_q=0, max_seqlen_k=0):
    """The one backward (dense, or varlen with cu_seqlens_q / _k) -> (dq, dk, dv, dmask, drel_bias)."""
    args = (dout, q, k, v, out, lse, rng_state, softmax_scale, causal, bottom_right, window_left, window_right, softcap,
            alibi_slopes, sink, attn_mask, dropout_p, deterministic, mask_grad, rel_bias, rel_buckets, rel_bias_grad,
            cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k)
    grads = (dout, q, k, v, out, lse, alibi_slopes, sink, attn_mask, rel_bias)
    return _dispatch(torch.ops.flashattn_ext.bwd.default, _BwdTransformed, None, args, grads)


def dropout_mask(*, q, rng_state, seqlen_k, dropout_p):
    """-> keep, bool (batch, nheads, seqlen_q, seqlen_k) of a (batch, seqlen_q, nheads, headdim) q."""
    return torch.ops.flashattn_ext.dropout_mask(q, rng_state, seqlen_k, dropout_p)


def varlen_fwd(*, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **kw):
    """fwd on a variable-length batch (the sequence boundaries required) -> (out, lse, rng_state)."""
    return fwd(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
               max_seqlen_k=max_seqlen_k, **kw)


def varlen_bwd(*, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **kw):
    """bwd on a variable-length batch -> (dq, dk, dv, drel_bias)."""
    dq, dk, dv, _, drel = bwd(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                              max_seqlen_k=max_seqlen_k, **kw)
    return dq, dk, dv, drel


def kvcache_fwd(*, q, k_cache, v_cache, **kw):
    """fwd over a KV cache (k_cache, v_cache as k, v) -> (out, lse)."""
    return fwd(q=q, k=k_cache, v=v_cache, **kw)[:2]


def kv_append(*, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx=None, block_table=None):
    """Writes k, v into k_cache, v_cache in place (csrc/kv_append.h) -> None."""
    torch.ops.flashattn_ext.kv_append(k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table)
