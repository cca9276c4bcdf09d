"""The op contract: the only module that calls the C++ ops torch.ops.flashattn_ext.* (schemas in csrc/ops.cpp) and
the extension's limits().
One wrapper per op, its parameters keyword-only and named as the schema's arguments, calls the op positionally
in schema order. *_ARGS are the schemas' argument names in order, read from the registered ops: ops.py takes
the input positions of its autograd formulas from them."""
import torch

from . import _C  # registers torch.ops.flashattn_ext.*

LIMITS = _C.limits()  # what the kernels of this build take (csrc/ops.cpp limits())
PAGE_MULTIPLE = LIMITS["page_multiple"]  # page sizes of a paged KV cache are multiples of it


def _arg_names(op):
    return tuple(a.name for a in getattr(torch.ops.flashattn_ext, op).default._schema.arguments)


FWD_ARGS = _arg_names("fwd")
BWD_ARGS = _arg_names("bwd")
VARLEN_FWD_ARGS = _arg_names("varlen_fwd")
VARLEN_BWD_ARGS = _arg_names("varlen_bwd")
KVCACHE_FWD_ARGS = _arg_names("kvcache_fwd")
DROPOUT_MASK_ARGS = _arg_names("dropout_mask")
KV_APPEND_ARGS = _arg_names("kv_append")


def fwd(*, q, k, v, softmax_scale, causal=False, bottom_right=True, window_left=-1, window_right=-1, softcap=0.0,
        alibi_slopes=None, sink=None, attn_mask=None, dropout_p=0.0, deterministic=False, rel_bias=None,
        rel_buckets=None):
    """-> (out, lse, rng_state) (the op's out32 is for its autograd, ops.py)."""
    return torch.ops.flashattn_ext.fwd(q, k, v, softmax_scale, causal, bottom_right, window_left, window_right,
                                       softcap, alibi_slopes, sink, attn_mask, dropout_p, deterministic, rel_bias,
                                       rel_buckets)[:3]


def bwd(*, dout, q, k, v, out, lse, rng_state, softmax_scale, causal=False, bottom_right=True, window_left=-1,
        window_right=-1, softcap=0.0, alibi_slopes=None, sink=None, attn_mask=None, dropout_p=0.0,
        deterministic=False, mask_grad=False, rel_bias=None, rel_buckets=None, rel_bias_grad=False):
    """-> (dq, dk, dv, dmask, drel_bias)."""
    return torch.ops.flashattn_ext.bwd(dout, q, k, v, out, lse, rng_state, softmax_scale, causal, bottom_right,
                                       window_left, window_right, softcap, alibi_slopes, sink, attn_mask, dropout_p,
                                       deterministic, mask_grad, rel_bias, rel_buckets, rel_bias_grad)


def dropout_mask(*, q, rng_state, seqlen_k, dropout_p):
    """-> keep, bool (batch, nheads, seqlen_q, seqlen_k) of a (batch, seqlen_q, nheads, headdim) q."""
    return torch.ops.flashattn_ext.dropout_mask(q, rng_state, seqlen_k, dropout_p)


def varlen_fwd(*, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k=None, max_seqlen_q, max_seqlen_k, softmax_scale,
               causal=False, window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None, sink=None,
               dropout_p=0.0, deterministic=False, block_table=None, rel_bias=None, rel_buckets=None):
    """-> (out, lse, rng_state) (the op's out32 is for its autograd, ops.py)."""
    return torch.ops.flashattn_ext.varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                                              max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
                                              alibi_slopes, sink, dropout_p, deterministic, block_table, rel_bias,
                                              rel_buckets)[:3]


def varlen_bwd(*, dout, q, k, v, out, lse, rng_state, cu_seqlens_q, cu_seqlens_k, seqused_k=None, max_seqlen_q,
               max_seqlen_k, softmax_scale, causal=False, window_left=-1, window_right=-1, softcap=0.0,
               alibi_slopes=None, sink=None, dropout_p=0.0, deterministic=False, rel_bias=None, rel_buckets=None,
               rel_bias_grad=False):
    """-> (dq, dk, dv, drel_bias)."""
    return torch.ops.flashattn_ext.varlen_bwd(dout, q, k, v, out, lse, rng_state, cu_seqlens_q, cu_seqlens_k,
                                              seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                                              window_left, window_right, softcap, alibi_slopes, sink, dropout_p,
                                              deterministic, rel_bias, rel_buckets, rel_bias_grad)


def kvcache_fwd(*, q, k_cache, v_cache, cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
                block_table=None, softmax_scale, causal=False, window_left=-1, window_right=-1, softcap=0.0,
                alibi_slopes=None, sink=None, num_splits=0):
    """-> (out, lse)."""
    return torch.ops.flashattn_ext.kvcache_fwd(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad,
                                               block_table, softmax_scale, causal, window_left, window_right,
                                               softcap, alibi_slopes, sink, num_splits)


def kv_append(*, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx=None, block_table=None):
    """Writes k, v into k_cache, v_cache in place (csrc/kv_append.h) -> None."""
    torch.ops.flashattn_ext.kv_append(k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table)
