"""The public functions: flash_attn_func on (batch, seqlen, nheads, headdim) tensors with
flash-attn's argument order, and scaled_dot_product_attention with torch's signature on
(batch, nheads, seqlen, headdim) tensors. Both pass views (strides), never copies, to the op."""
import math

import torch


def _check_tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def _default_scale(t):
    headdim = t.shape[-1] if t.dim() > 0 else 1
    return 1.0 / math.sqrt(headdim) if headdim > 0 else 1.0


def _check_scale(name, scale):
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"{name} must be a float or None, got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"{name} must be finite, got {scale}")
    return float(scale)


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    return_lse=False,
):
    """Exact attention softmax(q kᵀ · softmax_scale) v.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_kv, headdim), nheads a
    multiple of nheads_kv (GQA/MQA). Any strides with the last one 1. CPU: float32/float64; CUDA:
    float16/bfloat16 (head dim <= 256) and float32/float64.
    softmax_scale: default 1/sqrt(headdim).
    causal: bottom-right aligned as flash-attn >= 2.1: query i sees keys j <= i + seqlen_k - seqlen_q.
        A query that sees no key gets out = 0 and lse = -inf (and zero gradients).
    deterministic: bitwise reproducible backward on CUDA (the CPU backward always is).
    return_lse: also return lse (batch, nheads, seqlen_q), float32 (float64 for float64 inputs),
        the natural-log logsumexp of each row of scaled scores; it carries no gradient.
    dropout_p, window_size, softcap, alibi_slopes, return_attn_probs: flash-attn's arguments for
    features not built yet; anything but their defaults raises NotImplementedError.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
    if dropout_p != 0.0:
        raise NotImplementedError(f"flash_attn_func: dropout_p > 0 is not supported yet (got dropout_p={dropout_p})")
    if tuple(window_size) != (-1, -1):
        raise NotImplementedError(f"flash_attn_func: window_size is not supported yet (got window_size={window_size})")
    if softcap != 0.0:
        raise NotImplementedError(f"flash_attn_func: softcap is not supported yet (got softcap={softcap})")
    if alibi_slopes is not None:
        raise NotImplementedError("flash_attn_func: alibi_slopes is not supported yet")
    if return_attn_probs:
        raise NotImplementedError("flash_attn_func: return_attn_probs is not supported (use return_lse=True)")
    scale = _default_scale(q) if softmax_scale is None else _check_scale("softmax_scale", softmax_scale)
    out, lse = torch.ops.flashattn_ext.fwd(q, k, v, scale, bool(causal), True, bool(deterministic))
    return (out, lse) if return_lse else out


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Drop-in for torch.nn.functional.scaled_dot_product_attention on 4-D inputs.

    query: (batch, nheads, seqlen_q, headdim); key, value: (batch, nheads_kv, seqlen_k, headdim).
    is_causal is top-left aligned, as in torch: query i sees keys j <= i. nheads != nheads_kv needs
    enable_gqa=True, as in torch. Returns (batch, nheads, seqlen_q, headdim), a transposed view of a
    (batch, seqlen_q, nheads, headdim) tensor.
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check_tensor(name, t)
        if t.dim() != 4:
            raise ValueError(
                f"scaled_dot_product_attention: {name} must have 4 dimensions (batch, nheads, seqlen, headdim), "
                f"got {t.dim()}"
            )
    if attn_mask is not None:
        raise NotImplementedError("scaled_dot_product_attention: attn_mask is not supported yet (use is_causal)")
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"scaled_dot_product_attention: dropout_p > 0 is not supported yet (got dropout_p={dropout_p})"
        )
    if not enable_gqa and query.shape[1] != key.shape[1]:
        raise ValueError(
            f"scaled_dot_product_attention: nheads of query ({query.shape[1]}) and key ({key.shape[1]}) differ; "
            "pass enable_gqa=True for grouped-query attention"
        )
    softmax_scale = _default_scale(query) if scale is None else _check_scale("scale", scale)
    out, _ = torch.ops.flashattn_ext.fwd(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), softmax_scale, bool(is_causal), False, False
    )
    return out.transpose(1, 2)
