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
    return torch.ops.flashattn_ext.fwd(q, k, v, softmax_scale, causal, bottom_right, window_left, window_right,
                                       softcap, alibi_slopes, sink, attn_mask, dropout_p, deterministic, rel_bias,
                                       rel_buckets, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                                       max_seqlen_k, block_table, cache_seqlens, cache_batch_idx, cache_leftpad,
                                       num_splits)[:3]


def bwd(*, dout, q, k, v, out, lse, rng_state, softmax_scale, causal=False, bottom_right=True, window_left=-1,
        window_right=-1, softcap=0.0, alibi_slopes=None, sink=None, attn_mask=None, dropout_p=0.0,
        deterministic=False, mask_grad=False, rel_bias=None, rel_buckets=None, rel_bias_grad=False,
        cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, max_seqlen_q=0, max_seqlen_k=0):
    """The one backward (dense, or varlen with cu_seqlens_q / _k) -> (dq, dk, dv, dmask, drel_bias)."""
    return torch.ops.flashattn_ext.bwd(dout, q, k, v, out, lse, rng_state, softmax_scale, causal, bottom_right,
                                       window_left, window_right, softcap, alibi_slopes, sink, attn_mask, dropout_p,
                                       deterministic, mask_grad, rel_bias, rel_buckets, rel_bias_grad, cu_seqlens_q,
                                       cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k)


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
