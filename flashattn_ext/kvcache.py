"""flash_attn_with_kvcache: attention of new queries against a KV cache (generation), with flash-attn
2.8.3's signature and semantics. New keys / values are appended into the cache in place (rotary applied
first when cos / sin are given, in torch ops) by one op (flashattn_ext::kv_append: a C loop on the CPU, one
kernel on CUDA), then one forward (the op flashattn_ext::kvcache_fwd) attends over each sequence's keys. Dense
caches (batch_cache, seqlen_cache, nheads_kv, headdim), rows picked by cache_batch_idx, or paged caches
(num_pages, page_size, nheads_kv, headdim) with a block_table. Everything runs on q's device: no host
synchronization, nothing read back from cache_seqlens (unless check_cache_seqlens=True asks for it)."""
import torch

from . import _core
from ._checks import (_check_alibi, _check_bools, _check_index, _check_int, _check_scale, _check_sink, _check_softcap,
                      _check_tensor, _check_window, _default_scale, _symbolic)
from ._core import PAGE_MULTIPLE

_FN = "flash_attn_with_kvcache"


def _capacity(seqlen_k, block_table):
    """The rows a sequence can reach, for error messages."""
    if block_table is None:
        return f"{seqlen_k} rows per sequence"
    return f"{seqlen_k} rows per sequence: block_table's {block_table.shape[1]} pages"


def _check_seqlens_fit(cache_seqlens, seqlen_new, seqlen_k, block_table):
    """check_cache_seqlens=True: 0 <= cache_seqlens[b] <= seqlen_k - seqlen_new for every b, read on the host
    (a device synchronization on CUDA)."""
    for b, n in enumerate(cache_seqlens.tolist()):  # one copy to the host
        if not 0 <= n <= seqlen_k - seqlen_new:
            raise ValueError(f"{_FN}: cache_seqlens[{b}] ({n}) plus seqlen_new ({seqlen_new}) must fit k_cache "
                             f"({_capacity(seqlen_k, block_table)}) and be >= 0")


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
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check_tensor(name, t)
        if t.dim() != 4:
            raise ValueError(f"{_FN}: {name} must have 4 dimensions, got shape {tuple(t.shape)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            raise TypeError(f"{_FN}: {name} must have the dtype of q ({q.dtype}), got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{_FN}: {name} must be on the device of q ({q.device}), got {t.device}")
    if tuple(v_cache.shape[:3]) != tuple(k_cache.shape[:3]):
        raise ValueError(f"{_FN}: v_cache must have the shape of k_cache {tuple(k_cache.shape)} but for its head dim "
                         f"(the last), got {tuple(v_cache.shape)}")
    if k_cache.shape[3] != q.shape[3]:
        raise ValueError(f"{_FN}: the head dim of k_cache ({k_cache.shape[3]}) must be that of q ({q.shape[3]})")
    if (q.shape[2] % k_cache.shape[2] != 0) if k_cache.shape[2] else q.shape[2] != 0:
        raise ValueError(f"{_FN}: nheads of q ({q.shape[2]}) must be a multiple of nheads_kv of k_cache "
                         f"({k_cache.shape[2]})")
    _check_bools(_FN, causal=causal, rotary_interleaved=rotary_interleaved, return_softmax_lse=return_softmax_lse,
                 check_cache_seqlens=check_cache_seqlens)
    batch, seqlen_q, nheads, headdim = q.shape
    nheads_kv, headdim_v = k_cache.shape[2], v_cache.shape[3]
    device = q.device
    if cache_batch_idx is not None:
        _check_index(_FN, "cache_batch_idx", cache_batch_idx, device, (batch,))
    if cache_leftpad is not None:
        _check_index(_FN, "cache_leftpad", cache_leftpad, device, (batch,))
    if block_table is not None:
        _check_tensor("block_table", block_table)
        if block_table.dtype != torch.int32:
            raise TypeError(f"{_FN}: block_table must be int32, got {block_table.dtype}")
        if block_table.device != device:
            raise ValueError(f"{_FN}: block_table must be on the device of q ({device}), got {block_table.device}")
        if block_table.dim() != 2 or block_table.shape[0] != batch:
            raise ValueError(f"{_FN}: block_table must have shape (batch, max_pages) with batch = {batch}, got "
                             f"{tuple(block_table.shape)}")
        if cache_batch_idx is not None:
            raise ValueError(f"{_FN}: cache_batch_idx cannot be combined with block_table (as in flash-attn)")
        page_size = k_cache.shape[1]
        if page_size <= 0 or page_size % PAGE_MULTIPLE != 0:
            raise ValueError(f"{_FN}: the page size (dimension 1 of a paged k_cache) must be a positive multiple of "
                             f"{PAGE_MULTIPLE}, got {page_size}")
        seqlen_k = block_table.shape[1] * page_size
    else:
        seqlen_k = k_cache.shape[1]
        if cache_batch_idx is None and k_cache.shape[0] != batch:
            raise ValueError(f"{_FN}: k_cache must have batch size {batch} (that of q) without cache_batch_idx, got "
                             f"{k_cache.shape[0]}")

    if (k is None) != (v is None):
        raise ValueError(f"{_FN}: pass both k and v (the new keys and values) or neither")
    seqlen_new = 0
    if k is not None:
        seqlen_new = k.shape[1] if isinstance(k, torch.Tensor) and k.dim() == 4 else -1
        for name, t, cache, dim in (("k", k, "k_cache", headdim), ("v", v, "v_cache", headdim_v)):
            _check_tensor(name, t)
            if t.dim() != 4 or tuple(t.shape) != (batch, seqlen_new, nheads_kv, dim):
                raise ValueError(f"{_FN}: {name} must have shape (batch, seqlen_new, nheads_kv, head dim of {cache}) "
                                 f"= {(batch, 'seqlen_new', nheads_kv, dim)}, got {tuple(t.shape)}")
            if t.dtype != k_cache.dtype or t.device != device:
                raise TypeError(f"{_FN}: {name} must have the dtype and device of k_cache ({k_cache.dtype}, {device}),"
                                f" got {t.dtype}, {t.device}")
        if cache_seqlens is None:
            raise ValueError(f"{_FN}: appending k, v needs cache_seqlens (where the new rows go)")
        if seqlen_new > seqlen_k:
            raise ValueError(f"{_FN}: k, v append {seqlen_new} rows per sequence, more than k_cache holds "
                             f"({_capacity(seqlen_k, block_table)})")

    if cache_seqlens is not None and not isinstance(cache_seqlens, torch.Tensor):
        _check_int(_FN, "cache_seqlens", cache_seqlens)
        if not _symbolic(cache_seqlens):
            if not 0 <= cache_seqlens <= seqlen_k - seqlen_new:
                raise ValueError(f"{_FN}: cache_seqlens ({cache_seqlens}) plus seqlen_new ({seqlen_new}) must fit "
                                 f"k_cache ({_capacity(seqlen_k, block_table)})")
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=device)
    elif cache_seqlens is not None:
        _check_index(_FN, "cache_seqlens", cache_seqlens, device, (batch,))
        if check_cache_seqlens:
            _check_seqlens_fit(cache_seqlens, seqlen_new, seqlen_k, block_table)

    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError(f"{_FN}: pass both rotary_cos and rotary_sin or neither")
    if rotary_cos is not None:
        for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
            _check_tensor(name, t)
            if not t.is_floating_point() or t.device != device:
                raise TypeError(f"{_FN}: {name} must be a floating-point tensor on the device of q ({device})")
            if t.dim() != 2 or tuple(t.shape) != tuple(rotary_cos.shape):
                raise ValueError(f"{_FN}: rotary_cos and rotary_sin must have one shape (seqlen_ro, rotary_dim / 2), "
                                 f"got {tuple(rotary_cos.shape)} and {tuple(rotary_sin.shape)}")
        if k is None:
            raise ValueError(f"{_FN}: rotary_cos / rotary_sin need the new k and v (they rotate what is appended)")
        if not 0 < 2 * rotary_cos.shape[1] <= headdim:
            raise ValueError(f"{_FN}: rotary_dim = 2 * rotary_cos.shape[1] ({2 * rotary_cos.shape[1]}) must be in "
                             f"[1, headdim = {headdim}]")
        if rotary_cos.shape[0] < seqlen_k:
            raise ValueError(f"{_FN}: rotary_cos / rotary_sin must have at least the cache's {seqlen_k} rows, got "
                             f"{rotary_cos.shape[0]}")

    if sink is not None and s_aux is not None:
        raise ValueError(f"{_FN}: pass sink or s_aux, not both")
    window = _check_window(_FN, window_size)
    softcap = _check_softcap(_FN, softcap)
    alibi_slopes = _check_alibi(_FN, alibi_slopes, q)
    _check_int(_FN, "num_splits", num_splits)
    if num_splits < 0:
        raise ValueError(f"{_FN}: num_splits must be 0 (chosen by the kernels) or a positive count, got {num_splits}")
    scale = _default_scale(q.shape[-1]) if softmax_scale is None else _check_scale(_FN, "softmax_scale", softmax_scale)

    with torch.no_grad():
        sink = _check_sink(_FN, s_aux if sink is None else sink, q, nheads)
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
