"""flash_attn_with_kvcache: attention of new queries against a KV cache (generation), with flash-attn
2.8.3's signature and semantics. New keys / values are appended into the cache in place (rotary applied
first when cos / sin are given), then one forward (the op flashattn_ext::kvcache_fwd) attends over each
sequence's keys. Dense caches (batch_cache, seqlen_cache, nheads_kv, headdim), rows picked by
cache_batch_idx, or paged caches (num_pages, page_size, nheads_kv, headdim) with a block_table. Everything
runs as torch ops on q's device: no host synchronization, nothing read back from cache_seqlens (unless
check_cache_seqlens=True asks for it)."""
import torch

from . import _core
from ._checks import (_check_alibi, _check_bools, _check_cache_rows, _check_cache_seqlens, _check_kv_cache,
                      _check_new_kv, _check_num_splits, _check_rotary, _check_scale, _check_sink, _check_softcap,
                      _check_window, _default_scale, _sink_or_s_aux)

_FN = "flash_attn_with_kvcache"


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


def _cache_slots(positions, batch_rows, block_table, page_size):
    """(first index, second index) of cache rows positions (batch, n) (0 <= positions < the rows a sequence
    can reach): dense (cache batch, row), paged (page, row in page); table entries clamped to the pages."""
    if block_table is None:
        return batch_rows[:, None].expand_as(positions), positions
    slots = (positions // page_size).clamp(max=block_table.shape[1] - 1)
    return block_table.long().gather(1, slots), positions % page_size


def _append(cache, new, start, seqlen_k, batch_rows, block_table, page_size, fits):
    """cache rows start[b] + i (i < new.shape[1]) of sequence b = new[b, i], in place; rows past seqlen_k (the
    rows a sequence can reach) are dropped. fits: every row is known to be inside (an int cache_seqlens
    checked by shapes): one index_put_. Else dropped rows are redirected to the last row with the value that
    row ends with (its new row if one lands there, else its old content), so that every write stays inside
    the cache and duplicate targets all carry one value (index_put_ then is deterministic)."""
    n = new.shape[1]
    positions = _rotary_positions(start, n)  # (batch, n)
    if fits:
        cache.index_put_(_cache_slots(positions, batch_rows, block_table, page_size), new)
        return
    last = torch.full_like(start, seqlen_k - 1).long()[:, None]  # (batch, 1)
    last_old = cache[_cache_slots(last, batch_rows, block_table, page_size)][:, 0]  # read before any write
    at_last = (seqlen_k - 1) - start.long()  # the i whose row is the last one, if 0 <= i < n
    lands = (at_last >= 0) & (at_last < n)
    last_new = new.gather(1, at_last.clamp(0, n - 1)[:, None, None, None].expand(-1, 1, *new.shape[2:]))[:, 0]
    last_value = torch.where(lands[:, None, None], last_new, last_old)  # (batch, nheads_kv, headdim)
    values = torch.where((positions < seqlen_k)[:, :, None, None], new, last_value[:, None])
    cache.index_put_(_cache_slots(positions.clamp(max=seqlen_k - 1), batch_rows, block_table, page_size), values)


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

    q: (batch, seqlen_q, nheads, headdim). k_cache, v_cache: (batch_cache, seqlen_cache, nheads_kv, headdim),
        or, with block_table, a paged cache (num_pages, page_size, nheads_kv, headdim), page_size a multiple of
        16. nheads a multiple of nheads_kv. Any strides with the last one 1; same dtype as q.
    k, v: None, or new keys / values (batch, seqlen_new, nheads_kv, headdim), written into the cache in place
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
    Returns out (batch, seqlen_q, nheads, headdim), or (out, softmax_lse) with return_softmax_lse=True, lse
    (batch, nheads, seqlen_q) float32 (float64 for float64 inputs).
    """
    _check_kv_cache(_FN, q, k_cache, v_cache)
    _check_bools(_FN, causal=causal, rotary_interleaved=rotary_interleaved, return_softmax_lse=return_softmax_lse,
                 check_cache_seqlens=check_cache_seqlens)
    batch, seqlen_q, nheads, headdim = q.shape
    device = q.device
    seqlen_k, page_size = _check_cache_rows(_FN, k_cache, batch, device, cache_batch_idx, cache_leftpad, block_table)
    seqlen_new = _check_new_kv(_FN, k, v, k_cache, batch, headdim, cache_seqlens, seqlen_k, block_table)
    cache_seqlens, fits = _check_cache_seqlens(_FN, cache_seqlens, batch, device, seqlen_new, seqlen_k, block_table,
                                               check_cache_seqlens)
    _check_rotary(_FN, rotary_cos, rotary_sin, k, headdim, seqlen_k, device)
    sink = _sink_or_s_aux(_FN, sink, s_aux)
    window = _check_window(_FN, window_size)
    softcap = _check_softcap(_FN, softcap)
    alibi_slopes = _check_alibi(_FN, alibi_slopes, q)
    num_splits = _check_num_splits(_FN, num_splits)
    scale = _default_scale(q.shape[-1]) if softmax_scale is None else _check_scale(_FN, "softmax_scale", softmax_scale)

    with torch.no_grad():
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
            if seqlen_new > 0 and seqlen_k > 0 and k_cache.shape[0] > 0:
                batch_rows = (torch.arange(batch, device=device) if cache_batch_idx is None
                              else cache_batch_idx.long().clamp(0, k_cache.shape[0] - 1))
                table = None if block_table is None else block_table.clamp(0, k_cache.shape[0] - 1)
                _append(k_cache, k, start, seqlen_k, batch_rows, table, page_size, fits)
                _append(v_cache, v, start, seqlen_k, batch_rows, table, page_size, fits)
            seqused = start + seqlen_new
        out, lse = _core.kvcache_fwd(
            q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=seqused, cache_batch_idx=cache_batch_idx,
            cache_leftpad=cache_leftpad, block_table=block_table, softmax_scale=scale, causal=bool(causal),
            window_left=window[0], window_right=window[1], softcap=softcap, alibi_slopes=alibi_slopes, sink=sink,
            num_splits=num_splits,
        )
    return (out, lse) if return_softmax_lse else out
