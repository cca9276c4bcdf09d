"""The public functions: flash_attn_func on (batch, seqlen, nheads, headdim) tensors (v and out with a head
dim of their own, headdim_v) with flash-attn's argument order, its packed forms, flash_attn_varlen_func (and
packed forms) on variable-length batches (total_tokens, nheads, headdim) with cu_seqlens, and
scaled_dot_product_attention with torch's signature and contract (any rank, broadcast batch dims). All
check their arguments (errors name them; no host synchronization) and pass views (strides), never
copies, to the ops (scaled_dot_product_attention copies where the kernel needs it, see there); a
broadcast attn_mask travels as an expanded view, packed tensors as unbound views (so their gradients
come back into the packed tensor)."""
import itertools
import math

import torch

from . import _core
from ._checks import (_check_alibi, _check_bools, _check_dropout, _check_index, _check_kv_headdim, _check_mask,
                      _check_max_seqlen, _check_packed, _check_paged, _check_rel_bias, _check_scale, _check_sink,
                      _check_softcap, _check_tensor, _check_window, _default_scale, _symbolic)


def _attention(q, k, v, scale, causal, bottom_right, window, softcap, alibi_slopes, sink, mask, dropout_p,
               deterministic, rel_bias=None, rel_buckets=None):
    return _core.fwd(q=q, k=k, v=v, softmax_scale=scale, causal=bool(causal), bottom_right=bottom_right,
                     window_left=window[0], window_right=window[1], softcap=softcap, alibi_slopes=alibi_slopes,
                     sink=sink, attn_mask=mask, dropout_p=dropout_p, deterministic=bool(deterministic),
                     rel_bias=rel_bias, rel_buckets=rel_buckets)


def _probs_signed(q, k, v, scale, causal, window, softcap, alibi_slopes, sink, mask, dropout_p, lse, rng_state):
    """S_dmask for return_attn_probs: P (batch, nheads, seqlen_q, seqlen_k) in float32 (float64 for float64
    inputs), the entries dropout dropped negated."""
    from .reference import attention_probs

    p = attention_probs(q, k, v, softmax_scale=scale, causal=causal, window_size=window, softcap=softcap,
                        alibi_slopes=alibi_slopes, sink=sink, attn_mask=mask, lse=lse)
    if dropout_p > 0.0:
        keep = _core.dropout_mask(q=q, rng_state=rng_state, seqlen_k=k.shape[1], dropout_p=dropout_p)
        p = torch.where(keep, p, -p)
    return p


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
    *,
    sink=None,
    s_aux=None,
    attn_mask=None,
    rel_bias=None,
    rel_bias_max_distance=128,
    rel_bias_bidirectional=True,
):
    """Exact attention softmax(q kᵀ · softmax_scale) v with flash-attn's variants.

    q: (batch, seqlen_q, nheads, headdim); k: (batch, seqlen_k, nheads_kv, headdim); v: (batch, seqlen_k,
    nheads_kv, headdim_v), headdim_v equal to headdim or not (DeepSeek's MLA: 192 / 128); nheads a multiple
    of nheads_kv (GQA/MQA). Any strides with the last one 1. float16/bfloat16 (CPU: computed in float32,
    results rounded to the input dtype) and float32/float64. Head dims: any on the CPU; on CUDA headdim
    and headdim_v <= 512, the smaller operand zero-padded to the larger where they differ (float16 / bfloat16
    calls that no tensor-core tile of the GPU serves, such as the backward above 256 or head dims above 128 on
    sm86 / sm89, run on the float32 kernels, slower, with a warning).
    softmax_scale: default 1/sqrt(headdim) (q's head dim).
    causal: bottom-right aligned as flash-attn >= 2.1: query i sees keys j <= i + seqlen_k - seqlen_q.
    window_size (left, right): query i sees keys i + seqlen_k - seqlen_q - left <= j <= ... + right;
        -1 = unbounded; with causal=True, right is 0.
    softcap > 0: scores become softcap * tanh(scores / softcap).
    alibi_slopes: float32 (nheads,) or (batch, nheads): adds -slope * |i + seqlen_k - seqlen_q - j|.
    dropout_p: probability of dropping an attention weight (Philox, seeded from torch's generator of q's
        device); kept weights are scaled by 1 / (1 - p).
    sink (also accepted as s_aux, transformers' name): (nheads,) logits, one per head, that join every
        row's softmax denominator without a value (attention sinks); differentiable.
    attn_mask: bool (True = take part) or additive float, broadcastable to (batch, nheads, seqlen_q,
        seqlen_k); a float mask that requires grad gets its gradient.
    rel_bias: T5's relative position bias, a (nheads, num_buckets) table (float32; float64 for float64
        inputs; learnable: its gradient is returned): adds rel_bias[h, bucket(j - i')] with i' = i + seqlen_k -
        seqlen_q and T5's bucketing (transformers' T5Attention._relative_position_bucket with
        rel_bias_max_distance and rel_bias_bidirectional). Not with alibi_slopes. Every dtype; on CUDA the float32
        kernels (float16 / bfloat16 inputs converted, with a warning: no tensor-core kernel takes the table yet);
        first-order gradients only (the gradient of lse and double backward through it raise).
    A query that sees no key gets out = 0 and lse = -inf (the sink with a sink), zero gradients.
    deterministic: bitwise reproducible backward on CUDA (the CPU backward always is).
    Returns out (batch, seqlen_q, nheads, headdim_v).
    return_lse: also return lse (batch, nheads, seqlen_q), float32 (float64 for float64 inputs).
    return_attn_probs: return (out, lse, S_dmask) as flash-attn, S_dmask (batch, nheads, seqlen_q,
        seqlen_k) the probabilities with the entries dropout dropped negated (a test aid: it materializes
        seqlen_q x seqlen_k).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
    if q.dim() != 4:
        raise ValueError(f"flash_attn_func: q must have 4 dimensions (batch, seqlen, nheads, headdim), got {q.dim()}")
    _check_bools("flash_attn_func", causal=causal, deterministic=deterministic, return_attn_probs=return_attn_probs,
                 return_lse=return_lse)
    if sink is not None and s_aux is not None:
        raise ValueError("flash_attn_func: pass sink or s_aux, not both")
    dropout_p = _check_dropout("flash_attn_func", dropout_p)
    window = _check_window("flash_attn_func", window_size)
    softcap = _check_softcap("flash_attn_func", softcap)
    alibi_slopes = _check_alibi("flash_attn_func", alibi_slopes, q)
    radius = max(q.shape[1], k.shape[1] if k.dim() == 4 else 0)
    rel_bias, rel_buckets = _check_rel_bias("flash_attn_func", rel_bias, rel_bias_max_distance, rel_bias_bidirectional,
                                            q, q.shape[2], alibi_slopes, radius)
    if rel_bias is not None and return_attn_probs:
        raise ValueError("flash_attn_func: return_attn_probs is not supported with rel_bias")
    sink = _check_sink("flash_attn_func", s_aux if sink is None else sink, q, q.shape[2])
    shape = (q.shape[0], q.shape[2], q.shape[1], k.shape[1] if k.dim() == 4 else 0)
    mask = _check_mask("flash_attn_func", attn_mask, q.dtype, q.device, shape)
    scale = (_default_scale(q.shape[-1]) if softmax_scale is None
             else _check_scale("flash_attn_func", "softmax_scale", softmax_scale))
    out, lse, rng_state = _attention(q, k, v, scale, causal, True, window, softcap, alibi_slopes, sink, mask,
                                     dropout_p, deterministic, rel_bias, rel_buckets)
    if return_attn_probs:
        with torch.no_grad():
            s_dmask = _probs_signed(q, k, v, scale, causal, window, softcap, alibi_slopes, sink, mask, dropout_p,
                                    lse, rng_state)
        return out, lse, s_dmask
    return (out, lse) if return_lse else out


def _joins(t, i):
    """Whether dims i and i + 1 of t flatten into one without a copy."""
    size = t.shape[i + 1]
    return t.numel() == 0 or t.shape[i] == 1 or size == 1 or t.stride(i) == t.stride(i + 1) * size


def _batch_split(tensors, nbatch):
    """The leading nbatch (batch) dims of tensors, all of one shape there, as (loop, flat): flat the longest
    run of dims that every tensor flattens into one without a copy (the kernel's batch), loop the others
    (one kernel call per index). A run breaks where some tensor's strides do not allow it (a broadcast
    dim, stride 0, next to a real one, say)."""
    runs, start = [], 0
    for i in range(nbatch - 1):
        if not all(_joins(t, i) for t in tensors):
            runs.append(range(start, i + 1))
            start = i + 1
    runs.append(range(start, nbatch))
    sizes = [math.prod([tensors[0].shape[d] for d in run]) for run in runs]
    flat = runs[sizes.index(max(sizes))]
    return [d for d in range(nbatch) if d not in flat], flat


def _broadcast_shapes(*shapes):
    """torch.broadcast_shapes, in plain Python for int sizes (torch's goes through torch._refs: ~30 us a call of
    host time, the most of an eager SDPA call at small sizes); torch's own for symbolic sizes (a trace's guards).
    Raises RuntimeError where they do not broadcast, as torch's."""
    if not all(type(n) is int for shape in shapes for n in shape):
        return torch.broadcast_shapes(*shapes)
    if all(shape == shapes[0] for shape in shapes):
        return torch.Size(shapes[0])
    out = [1] * max(map(len, shapes), default=0)
    for shape in shapes:
        for i, n in enumerate(shape, len(out) - len(shape)):
            if n != 1 and n != out[i]:
                if out[i] != 1:
                    raise RuntimeError(f"shapes {shapes} do not broadcast")
                out[i] = n
    return torch.Size(out)


def _sdpa_heads(query, key, value, enable_gqa):
    """query, key, value (..., nheads*, seqlen, headdim) with the heads as the kernel takes them: query with
    nheads heads, key and value with one count that divides it. torch's rules: with enable_gqa, key and
    value heads each divide query's and are repeated (a copy only when they differ from each other); without
    it, heads broadcast as batch dims do (views)."""
    fn = "scaled_dot_product_attention"
    hq, hk, hv = query.shape[-3], key.shape[-3], value.shape[-3]
    if enable_gqa:
        if not (hq == hk == hv or (hk > 0 and hv > 0 and hq % hk == 0 and hq % hv == 0)):
            raise ValueError(f"{fn}: with enable_gqa=True, nheads of key ({hk}) and value ({hv}) must divide nheads "
                             f"of query ({hq})")
        if hk != hv:  # the kernel takes one head count for key and value: repeat both to their lcm
            common = math.lcm(hk, hv)
            key, value = key.repeat_interleave(common // hk, -3), value.repeat_interleave(common // hv, -3)
        return query, key, value
    try:
        hkv = _broadcast_shapes((hk,), (hv,))[0]
        heads = _broadcast_shapes((hq,), (hkv,))[0]
    except RuntimeError:
        raise ValueError(f"{fn}: nheads of query ({hq}), key ({hk}) and value ({hv}) do not broadcast; pass "
                         "enable_gqa=True for grouped-query attention") from None
    # no view where it would change nothing (int sizes only: a trace's symbolic ones get no new guard)
    expand = lambda t, h: (t if type(h) is int and t.shape[-3] == h  # noqa: E731
                           else t.expand(*t.shape[:-3], h, *t.shape[-2:]))
    return expand(query, heads), expand(key, hkv), expand(value, hkv)


def _sdpa_plain(query, key, value, enable_gqa):
    """Whether an SDPA call is the plain one that needs no broadcasting, head repeat or copy: 4-D query, key,
    value of one batch size (int sizes: not while torch.compile traces, whose symbolic sizes would get new guards),
    key and value of one head count that is query's (or divides it, with enable_gqa), each last stride 1."""
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 or _core._compiling():
        return False
    (b, hq, _, _), (bk, hk, _, _), (bv, hv, _, _) = query.shape, key.shape, value.shape
    if not (b == bk == bv and hk == hv and (hq == hk or (enable_gqa and hk > 0 and hq % hk == 0))):
        return False
    return all(t.shape[-1] <= 1 or t.stride(-1) == 1 for t in (query, key, value))


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Drop-in for torch.nn.functional.scaled_dot_product_attention.

    query (..., nheads, seqlen_q, headdim), key (..., nheads_kv, seqlen_k, headdim), value (..., nheads_kv,
    seqlen_k, headdim_v), any rank >= 2 (2-D: one head; the dims before nheads are batch dims) and any
    strides; the batch dims broadcast against each other as in torch, and so do the head counts unless
    enable_gqa=True, which lets nheads_kv (of key and of value, each) divide nheads instead. is_causal is
    top-left aligned, as in torch: query i sees keys j <= i. attn_mask: bool (True = take part) or additive
    float (cast to query's dtype), broadcastable to (..., nheads, seqlen_q, seqlen_k) (a 1-D (seqlen_k,)
    mask too, which torch rejects); not together with is_causal (as torch). A query row whose keys are all masked gives 0 (as torch). Returns (..., nheads,
    seqlen_q, headdim_v), a transposed view of a (..., seqlen_q, nheads, headdim_v) tensor.

    Broadcast inputs reach the kernel as expanded views (stride 0, never an expanded copy) and the batch
    dims are flattened into one without a copy; where their strides do not allow that (a broadcast dim next
    to a real one), the kernel runs once per index of the dims that do not flatten. Copies only where the
    kernel needs one: an input whose last stride is not 1, key and value heads that differ under enable_gqa
    (and on CUDA, whose kernels take one head dim, headdim_v != headdim: the op zero-pads the smaller one).
    """
    fn = "scaled_dot_product_attention"
    _check_bools(fn, is_causal=is_causal, enable_gqa=enable_gqa)
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check_tensor(name, t)
        if t.dim() < 2 or (enable_gqa and t.dim() < 3):
            least = "3 dimensions (..., nheads, seqlen, headdim) with enable_gqa=True" if enable_gqa else \
                "2 dimensions (..., seqlen, headdim)"
            raise ValueError(f"{fn}: {name} must have at least {least}, got {t.dim()}")
    if attn_mask is not None and is_causal:
        raise ValueError(f"{fn}: attn_mask and is_causal=True cannot be combined (as in torch)")
    dropout_p = _check_dropout(fn, dropout_p)
    headdim = query.shape[-1]
    if key.shape[-1] != headdim:
        raise ValueError(f"{fn}: key's head dim ({key.shape[-1]}) must equal query's ({headdim})")
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"{fn}: seqlen of key ({key.shape[-2]}) and value ({value.shape[-2]}) must match")
    softmax_scale = _default_scale(query.shape[-1]) if scale is None else _check_scale(fn, "scale", scale)

    def run(q, k, v, mask):  # (flat batch, nheads, seqlen, headdim) each -> out (flat batch, seqlen_q, nheads, dv)
        return _attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale, is_causal, False,
                          (-1, -1), 0.0, None, None, mask, dropout_p, False)[0]
    if attn_mask is None and _sdpa_plain(query, key, value, enable_gqa):
        # the common call (LLM layers, decode): one transposed view each way, none of the broadcast machinery below
        return run(query, key, value, None).transpose(1, 2)
    rank = max(query.dim(), key.dim(), value.dim())
    # The kernel's layout: last stride 1 (copy otherwise); value keeps its own head dim.
    query, key, value = [t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.clone(memory_format=torch.contiguous_format)
                         for t in (query, key, value)]  # clone: contiguous() keeps an empty tensor's strides
    query, key, value = [t if t.dim() >= 3 else t.unsqueeze(0) for t in (query, key, value)]
    query, key, value = _sdpa_heads(query, key, value, enable_gqa)
    try:
        batch = _broadcast_shapes(query.shape[:-3], key.shape[:-3], value.shape[:-3])
    except RuntimeError:
        raise ValueError(f"{fn}: the batch dims of query {tuple(query.shape[:-3])}, key {tuple(key.shape[:-3])} and "
                         f"value {tuple(value.shape[:-3])} do not broadcast") from None
    heads, seqlen_q, seqlen_k = query.shape[-3], query.shape[-2], key.shape[-2]
    if attn_mask is not None:
        _check_tensor("attn_mask", attn_mask)
        if attn_mask.dim() > rank:
            raise ValueError(f"{fn}: attn_mask must have at most {rank} dimensions, as many as the attention "
                             f"weights (..., seqlen_q, seqlen_k), got shape {tuple(attn_mask.shape)}")
    mask = _check_mask(fn, attn_mask, query.dtype, query.device, (*batch, heads, seqlen_q, seqlen_k))
    static = all(type(n) is int for n in batch)  # a trace's symbolic sizes: always the view, no new guard
    views = [t if static and t.shape[:-3] == batch else t.expand(*batch, *t.shape[-3:]) for t in (query, key, value)]
    views += [] if mask is None else [mask]
    if not batch:
        views = [t.unsqueeze(0) for t in views]
    loop, flat = _batch_split(views, max(len(batch), 1))
    outs = []
    for index in itertools.product(*[range(views[0].shape[d]) for d in loop]):
        at = [slice(None)] * len(views[0].shape)
        for d, i in zip(loop, index):
            at[d] = i
        q, k, v, *m = [t[tuple(at)].flatten(0, len(flat) - 1) for t in views] if loop or len(flat) > 1 else views
        outs.append(run(q, k, v, m[0] if m else None))  # (flat batch, seqlen_q, nheads, headdim_v)
    order = [*loop, *flat]
    out = torch.stack(outs) if loop else outs[0]
    out = out.reshape(*[views[0].shape[d] for d in order], *out.shape[-3:])
    if loop:  # back to the batch dims' order
        out = out.permute(*sorted(range(len(order)), key=order.__getitem__), *range(len(order), out.dim()))
    out = out.transpose(-3, -2)
    if not batch:
        out = out.squeeze(0)
    if rank < 3:
        out = out.squeeze(0)
    return out


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
    *,
    return_lse=False,
    sink=None,
    s_aux=None,
):
    """flash_attn_func on qkv (batch, seqlen, 3, nheads, headdim), q, k, v stacked at dimension 2 (read in
    place; the gradient comes back as one tensor of qkv's shape; one head dim for all three: flash_attn_func
    takes a v head dim of its own). Arguments and results as flash_attn_func."""
    q, k, v = _check_packed("flash_attn_qkvpacked_func", "qkv", qkv, 5, 2, 3, "(batch, seqlen, 3, nheads, headdim)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, return_lse, sink=sink, s_aux=s_aux)


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
    *,
    return_lse=False,
    sink=None,
    s_aux=None,
):
    """flash_attn_func on q (batch, seqlen_q, nheads, headdim) and kv (batch, seqlen_k, 2, nheads_kv, headdim),
    k and v stacked at dimension 2: one head dim, q's (a ValueError otherwise; flash_attn_func takes a v head
    dim of its own). Arguments and results as flash_attn_func."""
    fn, layout = "flash_attn_kvpacked_func", "(batch, seqlen_k, 2, nheads_kv, headdim)"
    k, v = _check_packed(fn, "kv", kv, 5, 2, 2, layout)
    _check_kv_headdim(fn, q, kv, layout)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, return_lse, sink=sink, s_aux=s_aux)


# ------------------------------------------------------------------------------------------------
# Variable-length batches
# ------------------------------------------------------------------------------------------------


def _varlen_probs_signed(q, k, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale, causal,
                         window, softcap, alibi_slopes, sink, dropout_p, lse, rng_state):
    """S_dmask of the varlen functions' return_attn_probs: (batch, nheads, max_seqlen_q, max_seqlen_k) in
    lse's dtype, in [s, :, :seqlen_q, :seqlen_k] the S_dmask flash_attn_func gives sequence s at batch index s
    (P, the entries dropout dropped negated), zeros elsewhere. A test aid: it reads cu_seqlens on the host."""
    from .reference import attention_probs, varlen_sequences

    batch, nheads = cu_seqlens_q.shape[0] - 1, q.shape[1]
    s_dmask = lse.new_zeros((batch, nheads, max_seqlen_q, max_seqlen_k))
    keep = None
    if dropout_p > 0.0:  # sequence s draws from the Philox stream of batch index s
        shape_q = q.new_empty((batch, max_seqlen_q, nheads, 1))
        keep = _core.dropout_mask(q=shape_q, rng_state=rng_state, seqlen_k=max_seqlen_k, dropout_p=dropout_p)
    sequences = varlen_sequences(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, q.shape[0],
                                 k.shape[0])
    for s, (q0, sq, k0, sk) in enumerate(sequences):
        if sq == 0 or sk == 0:
            continue
        slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes[s]
        p = attention_probs(q[None, q0:q0 + sq], k[None, k0:k0 + sk], None, softmax_scale=scale, causal=causal,
                            window_size=window, softcap=softcap, alibi_slopes=slopes, sink=sink,
                            lse=lse[None, :, q0:q0 + sq])[0]
        if keep is not None:
            p = torch.where(keep[s, :, :sq, :sk], p, -p)
        s_dmask[s, :, :sq, :sk] = p
    return s_dmask


def _paged_keys(k, block_table, cu_seqlens_k):
    """The keys of a paged call packed: (k_packed (total_k, nheads_kv, headdim), cu_seqlens_k of k_packed),
    sequence s's rows 0 .. n_s - 1 of its pages (n_s = cu_seqlens_k[s + 1] - cu_seqlens_k[s] clamped to the
    table's capacity, table entries to the pages, as the kernels read them). For return_attn_probs (a test
    aid): it reads cu_seqlens_k on the host."""
    page_size = k.shape[1]
    counts = (cu_seqlens_k[1:].long() - cu_seqlens_k[:-1].long()).clamp(0, block_table.shape[1] * page_size)
    seq = torch.repeat_interleave(torch.arange(counts.shape[0], device=k.device), counts)
    starts = torch.cumsum(counts, 0) - counts
    rows = torch.arange(seq.shape[0], device=k.device) - starts[seq]
    pages = block_table.long()[seq, rows // page_size].clamp(0, k.shape[0] - 1)
    cu = torch.cat((counts.new_zeros(1), torch.cumsum(counts, 0))).to(torch.int32)
    return k[pages, rows % page_size], cu


def _flash_attn_varlen(fn, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                       causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs, seqused_k,
                       return_lse, sink, s_aux, block_table=None, rel_bias=None, rel_bias_max_distance=128,
                       rel_bias_bidirectional=True):
    kv_layout = "(total_k, nheads_kv, headdim)" if block_table is None else "(num_pages, page_size, nheads_kv, headdim)"
    v_layout = kv_layout.replace("headdim)", "headdim_v)")
    for name, t, layout in (("q", q, "(total_q, nheads, headdim)"), ("k", k, kv_layout), ("v", v, v_layout)):
        _check_tensor(name, t)
        rank = 3 if name == "q" or block_table is None else 4
        if t.dim() != rank:
            raise ValueError(f"{fn}: {name} must have {rank} dimensions {layout}, got {t.dim()}")
    _check_index(fn, "cu_seqlens_q", cu_seqlens_q, q.device)
    _check_index(fn, "cu_seqlens_k", cu_seqlens_k, q.device)
    if cu_seqlens_q.shape[0] < 2:
        raise ValueError(f"{fn}: cu_seqlens_q must have batch + 1 >= 2 entries, got {cu_seqlens_q.shape[0]}")
    if cu_seqlens_k.shape[0] != cu_seqlens_q.shape[0]:
        raise ValueError(f"{fn}: cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got "
                         f"{cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}")
    batch, nheads = cu_seqlens_q.shape[0] - 1, q.shape[1]
    if seqused_k is not None:
        _check_index(fn, "seqused_k", seqused_k, q.device)
        if seqused_k.shape[0] != batch:
            raise ValueError(f"{fn}: seqused_k must have shape (batch,) = ({batch},), got {tuple(seqused_k.shape)}")
    max_seqlen_q = _check_max_seqlen(fn, "max_seqlen_q", max_seqlen_q)
    max_seqlen_k = _check_max_seqlen(fn, "max_seqlen_k", max_seqlen_k)
    _check_bools(fn, causal=causal, deterministic=deterministic, return_attn_probs=return_attn_probs,
                 return_lse=return_lse)
    if sink is not None and s_aux is not None:
        raise ValueError(f"{fn}: pass sink or s_aux, not both")
    dropout_p = _check_dropout(fn, dropout_p)
    window = _check_window(fn, window_size)
    softcap = _check_softcap(fn, softcap)
    alibi_slopes = _check_alibi(fn, alibi_slopes, q, batch, nheads)
    symbolic = _symbolic(max_seqlen_q) or _symbolic(max_seqlen_k)  # torch.compile: the table up to max_distance
    radius = rel_bias_max_distance if symbolic else max(max_seqlen_q, max_seqlen_k)
    rel_bias, rel_buckets = _check_rel_bias(fn, rel_bias, rel_bias_max_distance, rel_bias_bidirectional, q, nheads,
                                            alibi_slopes, radius)
    if rel_bias is not None and return_attn_probs:
        raise ValueError(f"{fn}: return_attn_probs is not supported with rel_bias")
    sink = _check_sink(fn, s_aux if sink is None else sink, q, nheads)
    if block_table is not None:
        _check_paged(fn, q, k, v, block_table, batch)
    scale = _default_scale(q.shape[-1]) if softmax_scale is None else _check_scale(fn, "softmax_scale", softmax_scale)
    out, lse, rng_state = _core.varlen_fwd(
        q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, softmax_scale=scale, causal=bool(causal),
        window_left=window[0], window_right=window[1], softcap=softcap, alibi_slopes=alibi_slopes, sink=sink,
        dropout_p=dropout_p, deterministic=bool(deterministic), block_table=block_table, rel_bias=rel_bias,
        rel_buckets=rel_buckets,
    )
    if return_attn_probs:
        with torch.no_grad():
            keys, cu_keys = (k, cu_seqlens_k) if block_table is None else _paged_keys(k, block_table, cu_seqlens_k)
            s_dmask = _varlen_probs_signed(q, keys, cu_seqlens_q, cu_keys, seqused_k, max_seqlen_q, max_seqlen_k,
                                           scale, causal, window, softcap, alibi_slopes, sink, dropout_p, lse,
                                           rng_state)
        return out, lse, s_dmask
    return (out, lse) if return_lse else out


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
    *,
    seqused_k=None,
    return_lse=False,
    sink=None,
    s_aux=None,
    rel_bias=None,
    rel_bias_max_distance=128,
    rel_bias_bidirectional=True,
):
    """flash_attn_func on a variable-length batch: the sequences are concatenated along the token dimension.

    q: (total_q, nheads, headdim); k: (total_k, nheads_kv, headdim); v: (total_k, nheads_kv, headdim_v), its
    head dim its own as in flash_attn_func; nheads a multiple of nheads_kv.
    cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) on q's device, the cumulative sequence lengths: sequence
        s is q[cu_seqlens_q[s]:cu_seqlens_q[s + 1]] with k, v[cu_seqlens_k[s]:cu_seqlens_k[s + 1]].
    max_seqlen_q, max_seqlen_k: Python ints, the longest query / key sequence (the grid size: longer
        sequences are cut there).
    seqused_k: int32 (batch,) or None: sequence s uses only its first seqused_k[s] keys.
    Every other argument as flash_attn_func, per sequence: causal and window_size are aligned bottom-right
    in each sequence (query i sees keys j <= i + seqlen_k - seqlen_q), alibi_slopes is (nheads,) or
    (batch, nheads), dropout draws for sequence s what flash_attn_func draws at batch index s, rel_bias
    (CPU) is each sequence's with i' = i + seqlen_k - seqlen_q of that sequence.
    Rows of q in no sequence get out 0 and lse -inf; keys in none (or past seqused_k) get dk = dv = 0.
    block_table: int32 (batch, max_pages) or None: a paged KV cache (flash-attn's paged varlen call), forward
        only. k, v are then (num_pages, page_size, nheads_kv, headdim / headdim_v), page_size a multiple of 16,
        and sequence s's keys are rows 0 .. n_s - 1 of its pages, n_s = cu_seqlens_k[s + 1] - cu_seqlens_k[s] (only the
        differences count; seqused_k still limits them): key r is row r % page_size of page
        block_table[s, r // page_size]. Out-of-range contents are clamped on the device (n_s to the table's
        max_pages * page_size rows, entries to the pages), never checked on the host. As in flash-attn there is
        no backward: the forward runs on inputs that require grad, a backward raises (naming block_table).
    Returns out (total_q, nheads, headdim_v); with return_lse=True (out, lse), lse (nheads, total_q) float32
    (float64 for float64 inputs); with return_attn_probs=True (out, lse, S_dmask), S_dmask (batch, nheads,
    max_seqlen_q, max_seqlen_k) holding sequence s's flash_attn_func S_dmask in [s, :, :seqlen_q, :seqlen_k]
    (a test aid: it materializes the probabilities and reads cu_seqlens on the host).
    No host synchronization otherwise: cu_seqlens' contents are never read on the host.
    """
    return _flash_attn_varlen("flash_attn_varlen_func", q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                              max_seqlen_k, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                              deterministic, return_attn_probs, seqused_k, return_lse, sink, s_aux, block_table,
                              rel_bias, rel_bias_max_distance, rel_bias_bidirectional)


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
    *,
    return_lse=False,
    sink=None,
    s_aux=None,
):
    """flash_attn_varlen_func on qkv (total, 3, nheads, headdim), the same cu_seqlens and max_seqlen for
    queries and keys (the gradient comes back as one tensor of qkv's shape)."""
    fn = "flash_attn_varlen_qkvpacked_func"
    q, k, v = _check_packed(fn, "qkv", qkv, 4, 1, 3, "(total, 3, nheads, headdim)")
    return _flash_attn_varlen(fn, q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                              causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs, None,
                              return_lse, sink, s_aux)


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
    *,
    seqused_k=None,
    return_lse=False,
    sink=None,
    s_aux=None,
):
    """flash_attn_varlen_func on q (total_q, nheads, headdim) and kv (total_k, 2, nheads_kv, headdim), k and v
    stacked at dimension 1: one head dim, q's (as flash_attn_kvpacked_func)."""
    fn, layout = "flash_attn_varlen_kvpacked_func", "(total_k, 2, nheads_kv, headdim)"
    k, v = _check_packed(fn, "kv", kv, 4, 1, 2, layout)
    _check_kv_headdim(fn, q, kv, layout)
    return _flash_attn_varlen(fn, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                              softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                              return_attn_probs, seqused_k, return_lse, sink, s_aux)
