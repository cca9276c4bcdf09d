"""flash-attn's function names, mapped onto flashattn_ext's functions of the same names.

Supported: flash_attn_func, flash_attn_qkvpacked_func, flash_attn_kvpacked_func, flash_attn_varlen_func,
flash_attn_varlen_qkvpacked_func, flash_attn_varlen_kvpacked_func (the packed forms pass the packed
tensor, whose gradient comes back as one tensor) and flash_attn_with_kvcache (cache append, rotary, paged
blocks, num_splits). flash_attn_varlen_func with a block_table (a paged KV cache, forward only: flash-attn's
test_flash_attn_varlen_causal with paged_kv_block_size) goes to flashattn_ext's
flash_attn_varlen_func(block_table=...); as in flash-attn its forward runs on inputs that require grad and
only a backward raises.

Return values follow flash-attn: out, or with return_attn_probs=True (out, softmax_lse, S_dmask),
where S_dmask is None without dropout (flash-attn returns no probabilities then either) and, with
dropout, flashattn_ext's S_dmask: the normalized probabilities P of shape (batch, nheads, seqlen_q,
seqlen_k) (varlen: (batch, nheads, max_seqlen_q, max_seqlen_k), sequence s in [s, :, :its seqlen_q,
:its seqlen_k]), the dropped entries negated. flash-attn's own S_dmask is unnormalized, blockwise, and
padded to rounded sequence lengths; the adapter plugin (dev/fa_compat/fa_compat_plugin.py) swaps the
test file's two helpers that decode it for ones that read this convention.

FA_BACKEND=eager routes the supported functions to dev/fa_compat/eager_backend.py, a plain torch
implementation of the same contract, to check the adapter itself apart from flashattn_ext's kernels.
"""
import os

import torch

if os.environ.get("FA_BACKEND", "flashattn_ext") == "eager":
    import eager_backend as _backend
else:
    import flashattn_ext as _backend


CPU_HALF_DTYPES = (torch.float16, torch.bfloat16)  # flashattn_ext's CPU kernels take float32/float64


def _window(window_size):
    """flash-attn's tests pass the window as a tensor of two ints; flashattn_ext takes Python ints."""
    return (int(window_size[0]), int(window_size[1]))


def _on_kernel_dtype(tensors):
    """float16/bfloat16 on the CPU (dev/run_fa_tests.sh cpu): computed in float32 and rounded back to
    the input dtype, as a half-precision kernel with float32 accumulation would (the casts are
    differentiable, so the gradients come back in the input dtype too)."""
    if tensors[0].device.type == "cpu" and tensors[0].dtype in CPU_HALF_DTYPES:
        return [t.float() for t in tensors]
    return list(tensors)


def _call(function, tensors, positional, variants, dropout_p, return_attn_probs):
    """function(*tensors (in the kernels' dtype), *positional, dropout_p=..., **variants) with flash-attn's
    return convention."""
    dtype = tensors[0].dtype
    args = _on_kernel_dtype(tensors) + list(positional)
    variants = dict(variants, window_size=_window(variants["window_size"]), softcap=float(variants["softcap"]),
                    dropout_p=dropout_p)
    if not return_attn_probs:
        return function(*args, **variants).to(dtype)
    if dropout_p > 0.0:
        out, lse, s_dmask = function(*args, return_attn_probs=True, **variants)
        return out.to(dtype), lse, s_dmask.to(dtype)
    out, lse = function(*args, return_lse=True, **variants)
    return out.to(dtype), lse, None


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
):
    """q (batch, seqlen_q, nheads, headdim); k, v (batch, seqlen_k, nheads_k, headdim)."""
    variants = dict(softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                    alibi_slopes=alibi_slopes, deterministic=deterministic)
    return _call(_backend.flash_attn_func, (q, k, v), (), variants, dropout_p, return_attn_probs)


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """qkv (batch, seqlen, 3, nheads, headdim)."""
    variants = dict(softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                    alibi_slopes=alibi_slopes, deterministic=deterministic)
    return _call(_backend.flash_attn_qkvpacked_func, (qkv,), (), variants, dropout_p, return_attn_probs)


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """q (batch, seqlen_q, nheads, headdim); kv (batch, seqlen_k, 2, nheads_k, headdim)."""
    variants = dict(softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                    alibi_slopes=alibi_slopes, deterministic=deterministic)
    return _call(_backend.flash_attn_kvpacked_func, (q, kv), (), variants, dropout_p, return_attn_probs)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
):
    """q (total_q, nheads, headdim); k, v (total_k, nheads_k, headdim); cu_seqlens int32 (batch + 1,). With
    block_table (batch, max_pages): k, v a paged cache (num_pages, page_size, nheads_k, headdim), sequence s's
    keys its first cu_seqlens_k[s + 1] - cu_seqlens_k[s] rows through block_table[s] (forward only)."""
    variants = dict(softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                    alibi_slopes=alibi_slopes, deterministic=deterministic)
    args = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if block_table is None:
        return _call(_backend.flash_attn_varlen_func, (q, k, v), args, variants, dropout_p, return_attn_probs)
    return _call(_backend.flash_attn_varlen_func, (q, k, v), args, dict(variants, block_table=block_table),
                 dropout_p, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(
    qkv,
    cu_seqlens,
    max_seqlen,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """qkv (total, 3, nheads, headdim)."""
    variants = dict(softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                    alibi_slopes=alibi_slopes, deterministic=deterministic)
    return _call(_backend.flash_attn_varlen_qkvpacked_func, (qkv,), (cu_seqlens, max_seqlen), variants, dropout_p,
                 return_attn_probs)


def flash_attn_varlen_kvpacked_func(
    q,
    kv,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """q (total_q, nheads, headdim); kv (total_k, 2, nheads_k, headdim)."""
    variants = dict(softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                    alibi_slopes=alibi_slopes, deterministic=deterministic)
    return _call(_backend.flash_attn_varlen_kvpacked_func, (q, kv),
                 (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), variants, dropout_p, return_attn_probs)


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
):
    """flash-attn's signature. float16/bfloat16 on the CPU: the tensors are computed in float32 (as
    _on_kernel_dtype) and the float32 caches, appended to in place, are rounded back into the caller's caches
    (rows that were not appended round-trip exactly)."""
    dtype = q.dtype
    tensors = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin)
    half_on_cpu = q.device.type == "cpu" and dtype in CPU_HALF_DTYPES
    if half_on_cpu:
        tensors = tuple(None if t is None else t.float() for t in tensors)
    result = _backend.flash_attn_with_kvcache(
        *tensors, cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
        block_table=block_table, softmax_scale=softmax_scale, causal=causal, window_size=_window(window_size),
        softcap=float(softcap), rotary_interleaved=rotary_interleaved, alibi_slopes=alibi_slopes,
        num_splits=num_splits, return_softmax_lse=return_softmax_lse)
    if half_on_cpu and k is not None:
        k_cache.copy_(tensors[1])
        v_cache.copy_(tensors[2])
    if return_softmax_lse:
        return result[0].to(dtype), result[1]
    return result.to(dtype)


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """flash-attn's S_dmask block width, used only by the test file's normalize_flash_attn_S, which the
    adapter plugin replaces (flashattn_ext's S_dmask is already normalized: no blocks to undo)."""
    raise NotImplementedError(
        "flashattn_ext's S_dmask has no blocks; run the tests with dev/run_fa_tests.sh, whose plugin "
        "replaces normalize_flash_attn_S"
    )
