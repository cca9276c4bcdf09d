"""The argument checks of the public functions, run before anything else: TypeError / ValueError naming the
argument and the function (fn, the first argument of every helper that takes one; _check_tensor's message
names the argument only). Scalars come back normalized (Python float / int; torch.compile's symbolic numbers
pass through, their checks run in the op). Also the package's one default softmax_scale and one lse dtype."""
import math
import numbers

import torch

from ._core import LIMITS, PAGE_MULTIPLE


def _symbolic(x):
    """True for torch.compile's symbolic numbers (dynamic shapes): their checks run in the op instead."""
    return isinstance(x, (torch.SymFloat, torch.SymInt))


def _lse_dtype(dtype):
    """The dtype of lse (and of the float math around it) for inputs of dtype."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _default_scale(headdim):
    """The default softmax_scale, 1 / sqrt(headdim) (1 for headdim 0)."""
    return 1.0 / math.sqrt(headdim) if headdim > 0 else 1.0


def _check_tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def _check_bools(fn, **flags):
    """Each flag a Python bool, as torch's own bool arguments (not an int, a string, a tensor or None)."""
    for name, x in flags.items():
        if not isinstance(x, bool):
            raise TypeError(f"{fn}: {name} must be a bool, got {type(x).__name__}")


def _check_int(fn, name, x):
    if isinstance(x, bool) or not isinstance(x, (numbers.Integral, torch.SymInt)):
        raise TypeError(f"{fn}: {name} must be an int, got {type(x).__name__}")
    return x


def _check_scale(fn, name, scale):
    """A real number (Python or NumPy int / float), finite -> float. Not a bool, and not a tensor: its gradient
    would be silently dropped and reading a CUDA tensor would synchronize (pass float(t) / t.item())."""
    if type(scale) is float and -math.inf < scale < math.inf:  # the common case first: a few us per call
        return scale
    if _symbolic(scale):
        return scale
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"{fn}: {name} must be a float or None, got {type(scale).__name__}")
    if not -math.inf < scale < math.inf:  # comparisons, not math.isfinite: torch.compile traces them
        raise ValueError(f"{fn}: {name} must be finite, got {scale}")
    return float(scale)


def _check_dropout(fn, dropout_p):
    if type(dropout_p) is float and 0.0 <= dropout_p <= 1.0:
        return dropout_p
    if _symbolic(dropout_p):
        return dropout_p
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"{fn}: dropout_p must be a float, got {type(dropout_p).__name__}")
    if not (0.0 <= dropout_p <= 1.0):
        raise ValueError(f"{fn}: dropout_p must be a real number in [0, 1], got {dropout_p}")
    return float(dropout_p)


def _check_window(fn, window_size):
    if type(window_size) is tuple and len(window_size) == 2:
        left, right = window_size
        if type(left) is int and type(right) is int and left >= -1 and right >= -1:
            return window_size
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: window_size must be a pair (left, right) of ints, got {window_size!r}")
    for name, w in (("left", left), ("right", right)):
        if _symbolic(w):
            continue
        if isinstance(w, bool) or not isinstance(w, numbers.Integral):
            raise TypeError(f"{fn}: window_size {name} must be an int, got {type(w).__name__}")
        if w < -1:
            raise ValueError(f"{fn}: window_size values must be >= -1 (-1: unbounded), got {window_size}")
    return tuple(w if _symbolic(w) else int(w) for w in (left, right))


def _check_softcap(fn, softcap):
    if type(softcap) is float and 0.0 <= softcap < math.inf:
        return softcap
    if _symbolic(softcap):
        return softcap
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"{fn}: softcap must be a float, got {type(softcap).__name__}")
    if not 0 <= softcap < math.inf:
        raise ValueError(f"{fn}: softcap must be finite and >= 0 (0: off), got {softcap}")
    return float(softcap)


def _check_alibi(fn, alibi_slopes, q, batch=None, nheads=None):
    """alibi_slopes (nheads,) or (batch, nheads) float32 on q's device; batch / nheads default to those
    of a (batch, seqlen, nheads, headdim) q."""
    if alibi_slopes is None:
        return None
    _check_tensor("alibi_slopes", alibi_slopes)
    if batch is None:
        batch, nheads = q.shape[0], q.shape[2]
    if alibi_slopes.dtype != torch.float32:
        raise TypeError(f"{fn}: alibi_slopes must be float32, got {alibi_slopes.dtype}")
    if alibi_slopes.device != q.device:
        raise ValueError(f"{fn}: alibi_slopes must be on the device of q ({q.device}), got {alibi_slopes.device}")
    if tuple(alibi_slopes.shape) not in ((nheads,), (batch, nheads)):
        raise ValueError(
            f"{fn}: alibi_slopes must have shape (nheads,) = ({nheads},) or (batch, nheads) = "
            f"({batch}, {nheads}), got {tuple(alibi_slopes.shape)}"
        )
    return alibi_slopes


def _check_sink(fn, sink, q, nheads):
    """sink (nheads,) of any floating dtype -> the lse dtype (a differentiable cast)."""
    if sink is None:
        return None
    _check_tensor("sink", sink)
    if not sink.is_floating_point():
        raise TypeError(f"{fn}: sink must be a floating-point tensor, got {sink.dtype}")
    if sink.device != q.device:
        raise ValueError(f"{fn}: sink must be on the device of q ({q.device}), got {sink.device}")
    if tuple(sink.shape) != (nheads,):
        raise ValueError(f"{fn}: sink must have shape (nheads,) = ({nheads},), got {tuple(sink.shape)}")
    return sink.to(_lse_dtype(q.dtype))


def _check_rel_bias(fn, rel_bias, max_distance, bidirectional, q, nheads, alibi_slopes, radius):
    """T5's relative position bias: rel_bias (nheads, num_buckets) of any floating dtype on q's device ->
    (the table in the lse dtype, a differentiable cast; the int32 bucket of each relative position -radius ..
    radius), or (None, None). radius: the largest |j - i'| of the call (max(seqlen_q, seqlen_k))."""
    if rel_bias is None:
        return None, None
    _check_tensor("rel_bias", rel_bias)
    _check_bools(fn, rel_bias_bidirectional=bidirectional)
    max_distance = _check_int(fn, "rel_bias_max_distance", max_distance)
    if not rel_bias.is_floating_point():
        raise TypeError(f"{fn}: rel_bias must be a floating-point tensor, got {rel_bias.dtype}")
    if rel_bias.device != q.device:
        raise ValueError(f"{fn}: rel_bias must be on the device of q ({q.device}), got {rel_bias.device}")
    if rel_bias.dim() != 2 or rel_bias.shape[0] != nheads:
        raise ValueError(f"{fn}: rel_bias must have shape (nheads, num_buckets) = ({nheads}, n), got "
                         f"{tuple(rel_bias.shape)}")
    if alibi_slopes is not None:
        raise ValueError(f"{fn}: rel_bias and alibi_slopes are both position biases; pass one")
    num_buckets = rel_bias.shape[1]
    max_exact = num_buckets // (4 if bidirectional else 2)
    if max_exact < 1:
        raise ValueError(f"{fn}: rel_bias needs num_buckets >= {4 if bidirectional else 2} "
                         f"(bidirectional={bidirectional}), got {num_buckets}")
    if max_distance <= max_exact:
        raise ValueError(f"{fn}: rel_bias_max_distance must exceed the exact buckets ({max_exact}), got "
                         f"{max_distance}")
    radius = max(1, min(int(max_distance), int(radius)))
    return rel_bias.to(_lse_dtype(q.dtype)), t5_buckets(num_buckets, max_distance, bidirectional, radius, q.device)


def t5_buckets(num_buckets, max_distance, bidirectional, radius, device):
    """int32 (2 radius + 1,): T5's bucket of each relative position j - i' = -radius .. radius, computed as
    transformers' T5Attention._relative_position_bucket (half the buckets exact, the rest logarithmic up to
    max_distance, beyond which the last bucket; bidirectional: the upper half for j > i'). Positions past
    max_distance fall in the bucket of max_distance, so the kernels clamp at +-radius."""
    rel = torch.arange(-radius, radius + 1, device=device)
    buckets = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets += (rel > 0).to(torch.long) * num_buckets
        rel = rel.abs()
    else:
        rel = -torch.min(rel, torch.zeros_like(rel))
    max_exact = num_buckets // 2
    large = max_exact + (torch.log(rel.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    buckets += torch.where(rel < max_exact, rel, large)
    return buckets.to(torch.int32)


def _check_mask(fn, attn_mask, q_dtype, device, shape):
    """attn_mask broadcastable to shape = (..., nheads, seqlen_q, seqlen_k) -> an expanded view of it,
    bool or in q's dtype (a float mask of another dtype is cast, differentiably)."""
    if attn_mask is None:
        return None
    _check_tensor("attn_mask", attn_mask)
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise TypeError(f"{fn}: attn_mask must be bool or floating point, got {attn_mask.dtype}")
    if attn_mask.device != device:
        raise ValueError(f"{fn}: attn_mask must be on the device of the query ({device}), got {attn_mask.device}")
    if attn_mask.dim() > len(shape):
        raise ValueError(f"{fn}: attn_mask must have at most {len(shape)} dimensions, got shape "
                         f"{tuple(attn_mask.shape)}")
    # Cast before expanding: a cast of the expanded view would materialize (batch, nheads, seqlen_q, seqlen_k).
    if attn_mask.is_floating_point() and attn_mask.dtype != q_dtype:
        attn_mask = attn_mask.to(q_dtype)
    try:
        return attn_mask.expand(shape)
    except RuntimeError:
        raise ValueError(
            f"{fn}: attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to (..., nheads, seqlen_q, "
            f"seqlen_k) = {tuple(shape)}"
        ) from None


def _check_packed(fn, name, t, rank, index, count, layout):
    """A packed tensor (qkv / kv): `rank` dimensions with `count` entries at dimension `index`."""
    _check_tensor(name, t)
    if t.dim() != rank or t.shape[index] != count:
        raise ValueError(f"{fn}: {name} must have shape {layout}, got {tuple(t.shape)}")
    return t.unbind(index)


def _check_kv_headdim(fn, q, kv, layout):
    """kv packs k and v with one head dim, which must then be q's (k's is): a v with a head dim of its own needs k
    and v apart."""
    _check_tensor("q", q)
    if q.dim() >= 1 and q.shape[-1] != kv.shape[-1]:
        raise ValueError(f"{fn}: kv {layout} packs k and v with one head dim, which must be that of q ({q.shape[-1]}), "
                         f"got {kv.shape[-1]}; for a v head dim of its own pass k and v apart "
                         f"({fn.replace('_kvpacked', '')})")


def _check_index(fn, name, t, device, shape=None):
    """An int32 index tensor (cu_seqlens_*, seqused_k, cache_seqlens, ...) on the device of q, 1-D or (shape
    given) of that shape; its contents are not read."""
    _check_tensor(name, t)
    if t.dtype != torch.int32:
        raise TypeError(f"{fn}: {name} must be int32, got {t.dtype}")
    if shape is None and t.dim() != 1:
        raise ValueError(f"{fn}: {name} must be 1-D, got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{fn}: {name} must be on the device of q ({device}), got {t.device}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{fn}: {name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    return t


def _check_max_seqlen(fn, name, x):
    if _symbolic(x):
        return x
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{fn}: {name} must be a Python int (the longest sequence of the batch), got "
                        f"{type(x).__name__}")
    if x < 0:
        raise ValueError(f"{fn}: {name} must be >= 0, got {x}")
    return int(x)


def _check_paged(fn, q, k, v, block_table, batch):
    """block_table int32 (batch, max_pages >= 1) on q's device, k / v (num_pages, page_size, nheads_kv, headdim)
    with page_size a positive multiple of 16."""
    _check_tensor("block_table", block_table)
    if block_table.dtype != torch.int32:
        raise TypeError(f"{fn}: block_table must be int32, got {block_table.dtype}")
    if block_table.device != q.device:
        raise ValueError(f"{fn}: block_table must be on the device of q ({q.device}), got {block_table.device}")
    if block_table.dim() != 2 or block_table.shape[0] != batch or block_table.shape[1] < 1:
        raise ValueError(f"{fn}: block_table must have shape (batch, max_pages) with batch = {batch} and max_pages "
                         f">= 1, got {tuple(block_table.shape)}")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"{fn}: with block_table, v must have the pages, page size and nheads_kv of k "
                         f"{tuple(k.shape[:3])}, got {tuple(v.shape[:3])}")
    page_size = k.shape[1]
    if not _symbolic(page_size) and (page_size <= 0 or page_size % PAGE_MULTIPLE != 0):
        raise ValueError(f"{fn}: with block_table, the page size (dimension 1 of k (num_pages, page_size, nheads_kv, "
                         f"headdim)) must be a positive multiple of {PAGE_MULTIPLE}, got {page_size}")


def _sink_or_s_aux(fn, sink, s_aux):
    """The attention sink given as sink or as s_aux (its gpt-oss name), or None."""
    if sink is not None and s_aux is not None:
        raise ValueError(f"{fn}: pass sink or s_aux, not both")
    return s_aux if sink is None else sink


def _check_num_splits(fn, num_splits):
    _check_int(fn, "num_splits", num_splits)
    if num_splits < 0:
        raise ValueError(f"{fn}: num_splits must be 0 (chosen by the kernels) or a positive count, got {num_splits}")
    return num_splits


# flash_attn_with_kvcache (kvcache.py): its cache, the appended rows, cache_seqlens and the rotary tables.

def _capacity(seqlen_k, block_table):
    """The rows a sequence of a KV cache can reach, for error messages."""
    if block_table is None:
        return f"{seqlen_k} rows per sequence"
    return f"{seqlen_k} rows per sequence: block_table's {block_table.shape[1]} pages"


def _check_kv_cache(fn, q, k_cache, v_cache):
    """q, k_cache, v_cache 4-D tensors, the caches of q's dtype and device and of one shape but for v_cache's head
    dim (its own), k_cache's head dim that of q."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check_tensor(name, t)
        if t.dim() != 4:
            raise ValueError(f"{fn}: {name} must have 4 dimensions, got shape {tuple(t.shape)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            raise TypeError(f"{fn}: {name} must have the dtype of q ({q.dtype}), got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{fn}: {name} must be on the device of q ({q.device}), got {t.device}")
    if tuple(v_cache.shape[:3]) != tuple(k_cache.shape[:3]):
        raise ValueError(f"{fn}: v_cache must have the shape of k_cache {tuple(k_cache.shape)} but for its head dim "
                         f"(the last), got {tuple(v_cache.shape)}")
    if k_cache.shape[3] != q.shape[3]:
        raise ValueError(f"{fn}: the head dim of k_cache ({k_cache.shape[3]}) must be that of q ({q.shape[3]})")
    if (q.shape[2] % k_cache.shape[2] != 0) if k_cache.shape[2] else q.shape[2] != 0:
        raise ValueError(f"{fn}: nheads of q ({q.shape[2]}) must be a multiple of nheads_kv of k_cache "
                         f"({k_cache.shape[2]})")
    half = q.dtype in (torch.float16, torch.bfloat16)
    top = LIMITS["cuda_max_head_dim" if half else "cuda_max_head_dim_simple"]
    if q.is_cuda and max(q.shape[3], v_cache.shape[3]) > top:
        name = "q and k_cache" if q.shape[3] > top else "v_cache"
        raise ValueError(f"{fn}: on CUDA, the head dim (last dimension) of {name} must be at most {top} for "
                         f"{'float16 / bfloat16' if half else 'float32 / float64'}, "
                         f"got {max(q.shape[3], v_cache.shape[3])} (the CPU takes any head dim)")


def _check_cache_rows(fn, k_cache, batch, device, cache_batch_idx, cache_leftpad, block_table):
    """The index tensors that pick a sequence's cache rows -> seqlen_k, the rows a sequence can reach."""
    if cache_batch_idx is not None:
        _check_index(fn, "cache_batch_idx", cache_batch_idx, device, (batch,))
    if cache_leftpad is not None:
        _check_index(fn, "cache_leftpad", cache_leftpad, device, (batch,))
    if block_table is None:
        if cache_batch_idx is None and k_cache.shape[0] != batch:
            raise ValueError(f"{fn}: k_cache must have batch size {batch} (that of q) without cache_batch_idx, got "
                             f"{k_cache.shape[0]}")
        return k_cache.shape[1]
    _check_tensor("block_table", block_table)
    if block_table.dtype != torch.int32:
        raise TypeError(f"{fn}: block_table must be int32, got {block_table.dtype}")
    if block_table.device != device:
        raise ValueError(f"{fn}: block_table must be on the device of q ({device}), got {block_table.device}")
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"{fn}: block_table must have shape (batch, max_pages) with batch = {batch}, got "
                         f"{tuple(block_table.shape)}")
    if cache_batch_idx is not None:
        raise ValueError(f"{fn}: cache_batch_idx cannot be combined with block_table (as in flash-attn)")
    page_size = k_cache.shape[1]
    if page_size <= 0 or page_size % PAGE_MULTIPLE != 0:
        raise ValueError(f"{fn}: the page size (dimension 1 of a paged k_cache) must be a positive multiple of "
                         f"{PAGE_MULTIPLE}, got {page_size}")
    return block_table.shape[1] * page_size


def _check_new_kv(fn, k, v, k_cache, v_cache, batch, cache_seqlens, seqlen_k, block_table):
    """The rows to append, k (batch, seqlen_new, nheads_kv, k_cache's head dim) and v (..., v_cache's head dim) or
    both None -> seqlen_new."""
    if (k is None) != (v is None):
        raise ValueError(f"{fn}: pass both k and v (the new keys and values) or neither")
    if k is None:
        return 0
    batch_new = (batch, k.shape[1] if isinstance(k, torch.Tensor) and k.dim() == 4 else -1, k_cache.shape[2])
    for name, t, cache in (("k", k, k_cache), ("v", v, v_cache)):
        _check_tensor(name, t)
        cname = "k_cache" if cache is k_cache else "v_cache"
        if t.dim() != 4 or tuple(t.shape) != batch_new + (cache.shape[3],):
            raise ValueError(f"{fn}: {name} must have shape (batch, seqlen_new, nheads_kv, head dim of {cname}) = "
                             f"{(batch, 'seqlen_new', k_cache.shape[2], cache.shape[3])}, got {tuple(t.shape)}")
        if t.dtype != k_cache.dtype or t.device != k_cache.device:
            raise TypeError(f"{fn}: {name} must have the dtype and device of k_cache ({k_cache.dtype}, "
                            f"{k_cache.device}), got {t.dtype}, {t.device}")
    seqlen_new = k.shape[1]
    if cache_seqlens is None:
        raise ValueError(f"{fn}: appending k, v needs cache_seqlens (where the new rows go)")
    if seqlen_new > seqlen_k:
        raise ValueError(f"{fn}: k, v append {seqlen_new} rows per sequence, more than k_cache holds "
                         f"({_capacity(seqlen_k, block_table)})")
    return seqlen_new


def _check_seqlens_fit(fn, cache_seqlens, seqlen_new, seqlen_k, block_table):
    """check_cache_seqlens=True: 0 <= cache_seqlens[b] <= seqlen_k - seqlen_new for every b, read on the host
    (a device synchronization on CUDA)."""
    for b, n in enumerate(cache_seqlens.tolist()):  # one copy to the host
        if not 0 <= n <= seqlen_k - seqlen_new:
            raise ValueError(f"{fn}: cache_seqlens[{b}] ({n}) plus seqlen_new ({seqlen_new}) must fit k_cache "
                             f"({_capacity(seqlen_k, block_table)}) and be >= 0")


def _check_cache_seqlens(fn, cache_seqlens, batch, device, seqlen_new, seqlen_k, block_table, check_contents):
    """cache_seqlens (None, an int or int32 (batch,)) -> None or an int32 (batch,) tensor. An int is checked
    against the shapes; a tensor's contents are read only with check_contents."""
    if cache_seqlens is None:
        return None
    if isinstance(cache_seqlens, torch.Tensor):
        _check_index(fn, "cache_seqlens", cache_seqlens, device, (batch,))
        if check_contents:
            _check_seqlens_fit(fn, cache_seqlens, seqlen_new, seqlen_k, block_table)
        return cache_seqlens
    _check_int(fn, "cache_seqlens", cache_seqlens)
    if not _symbolic(cache_seqlens) and not 0 <= cache_seqlens <= seqlen_k - seqlen_new:
        raise ValueError(f"{fn}: cache_seqlens ({cache_seqlens}) plus seqlen_new ({seqlen_new}) must fit "
                         f"k_cache ({_capacity(seqlen_k, block_table)})")
    return torch.full((batch,), cache_seqlens, dtype=torch.int32, device=device)


def _check_rotary(fn, rotary_cos, rotary_sin, k, headdim, seqlen_k, device):
    """rotary_cos / rotary_sin: both None, or floating (seqlen_ro >= seqlen_k, rotary_dim / 2) on the device,
    rotary_dim <= headdim, with new rows k to rotate."""
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError(f"{fn}: pass both rotary_cos and rotary_sin or neither")
    if rotary_cos is None:
        return
    for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        _check_tensor(name, t)
        if not t.is_floating_point() or t.device != device:
            raise TypeError(f"{fn}: {name} must be a floating-point tensor on the device of q ({device})")
        if t.dim() != 2 or tuple(t.shape) != tuple(rotary_cos.shape):
            raise ValueError(f"{fn}: rotary_cos and rotary_sin must have one shape (seqlen_ro, rotary_dim / 2), "
                             f"got {tuple(rotary_cos.shape)} and {tuple(rotary_sin.shape)}")
    if k is None:
        raise ValueError(f"{fn}: rotary_cos / rotary_sin need the new k and v (they rotate what is appended)")
    if not 0 < 2 * rotary_cos.shape[1] <= headdim:
        raise ValueError(f"{fn}: rotary_dim = 2 * rotary_cos.shape[1] ({2 * rotary_cos.shape[1]}) must be in "
                         f"[1, headdim = {headdim}]")
    if rotary_cos.shape[0] < seqlen_k:
        raise ValueError(f"{fn}: rotary_cos / rotary_sin must have at least the cache's {seqlen_k} rows, got "
                         f"{rotary_cos.shape[0]}")
