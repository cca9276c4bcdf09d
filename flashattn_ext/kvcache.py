"""flash_attn_with_kvcache: attention of new queries against a KV cache (generation), with flash-attn
2.8.3's signature and semantics. New keys / values are appended into the cache in place (rotary applied
first when cos / sin are given, in torch ops) by one op (flashattn_ext::kv_append: a C loop on the CPU, one
kernel on CUDA), then one forward (flashattn_ext::fwd, the caches as k, v) attends over each sequence's keys. Dense
caches (batch_cache, seqlen_cache, nheads_kv, headdim), rows picked by cache_batch_idx, or paged caches
(num_pages, page_size, nheads_kv, headdim) with a block_table. Everything runs on q's device: no host
synchronization, nothing read back from cache_seqlens (unless check_cache_seqlens=True asks for it)."""
import contextlib

import torch

from . import _core
from ._checks import (_check_alibi, _check_bools, _check_cache_rows, _check_cache_seqlens, _check_kv_cache,
                      _check_new_kv, _check_num_splits, _check_rotary, _check_scale, _check_sink, _check_softcap,
                      _check_window, _default_scale, _sink_or_s_aux)

_FN = "flash_attn_with_kvcache"
_NO_CONTEXT = contextlib.nullcontext()  # reusable: it holds no state


def _rotary_positions(start, length):
    """(batch, length) int64 positions start[b] + i."""
    return start[:, None].long() + torch.arange(length, device=start.device)


def apply_rotary(x, cos, sin, positions, interleaved):
    """Rotary embedding of x (batch, seqlen, nheads, headdim) at positions (batch, seqlen) (int64, clamped to
    the rows of cos / sin): the first rotary_dim = 2 * cos.shape[1] channels are rotated by the angle of
    row positions[b, i] of cos / sin (seqlen_ro, rotary_dim / 2), the others are left as they are.
    interleaved=True rotates channel pairs (2c, 2c + 1) (GPT-J), False the halves (c, c + rotary_dim / 2)
    (GPT-NeoX). Computed in float32 for float16 / bfloat16 (in x's dtype otherwise) and rounded to x's dtype."""
    half = cos.shape[1]
    rotary_dim = 2 * half
    compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    rows = positions.clamp(0, cos.shape[0] - 1)
    c = cos.to(compute)[rows][:, :, None, :]  # (batch, seqlen, 1, rotary_dim / 2)
    s = sin.to(compute)[rows][:, :, None, :]
    xr = x[..., :rotary_dim].to(compute)
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        rotated = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
        rotated = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., rotary_dim:]), dim=-1)


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
    *,
    sink=None,
    s_aux=None,
    check_cache_seqlens=False,
):
    """Attention of q against a KV cache, after appending k, v to it (flash-attn's flash_attn_with_kvcache).

    q: (batch, seqlen_q, nheads, headdim). k_cache: (batch_cache, seqlen_cache, nheads_kv, headdim), v_cache the
        same with a head dim of its own, headdim_v (as flash_attn_func's v; DeepSeek's MLA decode: 576 / 512),
        or, with block_table, a paged cache (num_pages, page_size, nheads_kv, headdim / headdim_v), page_size a
        multiple of 16. nheads a multiple of nheads_kv. Any strides with the last one 1; same dtype as q.
    k, v: None, or new keys / values (batch, seqlen_new, nheads_kv, headdim / headdim_v: those of k_cache /
        v_cache), written into the cache in place
        at rows cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 of sequence b (its cache batch
        cache_batch_idx[b], or its pages block_table[b, row // page_size]); needs cache_seqlens.
    rotary_cos, rotary_sin: None, or (seqlen_ro, rotary_dim / 2), seqlen_ro >= the cache's rows (seqlen_cache,
        or max_pages * page_size), rotary_dim <= headdim; needs k. Before the append, new key i of sequence b is
        rotated at position cache_seqlens[b] + i, and query i at cache_seqlens[b] + i when causal or with a
        window (else every query at cache_seqlens[b]); positions are cache rows (flash-attn does not subtract
        cache_leftpad). rotary_interleaved: True rotates channel pairs (GPT-J), False the halves (GPT-NeoX).
    cache_seqlens: an int or int32 (batch,): the rows of the cache in use before the append, counted from row
        0 (cache_leftpad included). None: the whole cache is in use.
    cache_batch_idx: int32 (batch,) or None: sequence b uses cache batch cache_batch_idx[b] (default b); not
        with block_table (as flash-attn).
    cache_leftpad: int32 (batch,) or None: sequence b's keys start at row cache_leftpad[b].
    block_table: int32 (batch, max_pages) or None: a paged cache; row r of sequence b is row r % page_size of
        page block_table[b, r // page_size].
    Sequence b then attends to its cache rows [cache_leftpad[b], cache_seqlens[b] + seqlen_new). causal and
    window_size are aligned bottom-right on those keys (query i sees key j <= i + seqlen_keys - seqlen_q);
    softcap, alibi_slopes ((nheads,) or (batch, nheads) float32), sink / s_aux ((nheads,) logits) as
    flash_attn_func. num_splits (Flash-Decoding, CUDA fp16/bf16 decode kernel): 1 = no split, n > 1 = the keys of
    each query split over n blocks whose partial results one combine kernel merges, 0 = chosen from the GPU's
    SM count and the sizes; the result agrees within float rounding whatever the count (the CPU and the
    fp32/fp64 kernels do not split).
    A cache too small for the append raises (ValueError naming k_cache) before anything is written, from
    shapes alone: seqlen_new rows longer than the cache's (seqlen_cache, or max_pages * page_size), or an
    int cache_seqlens with cache_seqlens + seqlen_new past them. The contents of a cache_seqlens tensor are
    checked only with check_cache_seqlens=True: then every 0 <= cache_seqlens[b] <= rows - seqlen_new, or
    ValueError before anything is written. That reads cache_seqlens on the host, a device synchronization
    on CUDA (flash-attn >= #2709 always does it for paged caches), and under torch.compile a graph break;
    on the CPU it costs about 1-2 us, in the noise of a decode step (README). Unchecked, out-of-range
    contents stay memory-safe: they are clamped on the device (rows past the cache are dropped, never
    written outside it, attention uses the rows that exist; cache_batch_idx / block_table entries are
    clamped to the cache). Sequences that share cache rows (or pages) and append to them race, as in
    flash-attn.
    No autograd: the result never requires grad (flash-attn's function has no backward either).
    Returns out (batch, seqlen_q, nheads, headdim_v), or (out, softmax_lse) with return_softmax_lse=True, lse
    (batch, nheads, seqlen_q) float32 (float64 for float64 inputs).
    """
    _check_kv_cache(_FN, q, k_cache, v_cache)
    _check_bools(_FN, causal=causal, rotary_interleaved=rotary_interleaved, return_softmax_lse=return_softmax_lse,
                 check_cache_seqlens=check_cache_seqlens)
    batch, seqlen_q, nheads, headdim = q.shape
    device = q.device
    seqlen_k = _check_cache_rows(_FN, k_cache, batch, device, cache_batch_idx, cache_leftpad, block_table)
    seqlen_new = _check_new_kv(_FN, k, v, k_cache, v_cache, batch, cache_seqlens, seqlen_k, block_table)
    cache_seqlens = _check_cache_seqlens(_FN, cache_seqlens, batch, device, seqlen_new, seqlen_k, block_table,
                                         check_cache_seqlens)
    _check_rotary(_FN, rotary_cos, rotary_sin, k, headdim, seqlen_k, device)
    sink = _sink_or_s_aux(_FN, sink, s_aux)
    window = _check_window(_FN, window_size)
    softcap = _check_softcap(_FN, softcap)
    alibi_slopes = _check_alibi(_FN, alibi_slopes, q)
    num_splits = _check_num_splits(_FN, num_splits)
    scale = _default_scale(q.shape[-1]) if softmax_scale is None else _check_scale(_FN, "softmax_scale", softmax_scale)

    # no autograd record (the cache call has no backward; kv_append writes in place); no_grad's context is entered
    # only where grad mode is on (~1.5 us of host time per call; decode loops mostly run without grad)
    with torch.no_grad() if torch.is_grad_enabled() else _NO_CONTEXT:
        sink = _check_sink(_FN, sink, q, nheads)
        seqused = cache_seqlens
        if k is not None:
            start = cache_seqlens.clamp(0, seqlen_k)
            if rotary_cos is not None:
                # flash-attn rotates queries per row under causal or a window narrower than the cache
                per_row = causal or any(0 <= w < seqlen_k for w in window)
                q_positions = (_rotary_positions(start, seqlen_q) if per_row
                               else start[:, None].long().expand(batch, seqlen_q))
                q = apply_rotary(q, rotary_cos, rotary_sin, q_positions, rotary_interleaved)
                k = apply_rotary(k, rotary_cos, rotary_sin, _rotary_positions(start, seqlen_new), rotary_interleaved)
            _core.kv_append(k_cache=k_cache, v_cache=v_cache, k=k, v=v, cache_seqlens=cache_seqlens,
                            cache_batch_idx=cache_batch_idx, block_table=block_table)
            seqused = start + seqlen_new
        out, lse = _core.kvcache_fwd(
            q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=seqused, cache_batch_idx=cache_batch_idx,
            cache_leftpad=cache_leftpad, block_table=block_table, softmax_scale=scale, causal=bool(causal),
            window_left=window[0], window_right=window[1], softcap=softcap, alibi_slopes=alibi_slopes, sink=sink,
            num_splits=num_splits,
        )
    return (out, lse) if return_softmax_lse else out
