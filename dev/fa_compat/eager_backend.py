"""flashattn_ext.flash_attn_func's, flash_attn_varlen_func's and flash_attn_with_kvcache's contracts (and the
packed forms) written in plain torch (float32 math, autograd for the gradients), to check the adapter on its own:
FA_BACKEND=eager dev/run_fa_tests.sh ... runs flash-attn's tests against this instead of flashattn_ext's
kernels. A failure then is the adapter's (or a case that flash-attn's test itself cannot pass), not a
kernel's.

Dropout here draws its keep-mask with torch.rand, not flashattn_ext's Philox stream: flash-attn's
tests read the mask back from S_dmask, so any mask with the right keep probability serves.
"""
import math

import torch


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
    """q (B, Sq, H, D); k, v (B, Sk, Hkv, D). Returns out, (out, lse) or (out, lse, S_dmask)."""
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(headdim) if softmax_scale is None else softmax_scale
    group = nheads // nheads_k
    qf = q.float()
    kf = k.float().repeat_interleave(group, dim=2)
    vf = v.float().repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", qf, kf) * scale  # (B, H, Sq, Sk)
    if softcap > 0.0:
        scores = softcap * torch.tanh(scores / softcap)
    rows = torch.arange(seqlen_q, device=q.device)[:, None]
    cols = torch.arange(seqlen_k, device=q.device)[None, :]
    rel = cols - rows - (seqlen_k - seqlen_q)  # j - i - (sk - sq): 0 on the bottom-right diagonal
    left, right = window_size[0], 0 if causal else window_size[1]
    visible = torch.ones_like(rel, dtype=torch.bool)
    if left >= 0:
        visible &= rel >= -left
    if right >= 0:
        visible &= rel <= right
    if alibi_slopes is not None:
        slopes = alibi_slopes.float().reshape(-1, nheads, 1, 1)  # (B or 1, H, 1, 1)
        scores = scores - slopes * rel.abs().float()
    scores = scores.masked_fill(~visible, float("-inf"))
    empty = ~visible.any(dim=-1, keepdim=True)  # (Sq, 1): rows that see no key
    probs = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    lse = torch.logsumexp(scores.detach(), dim=-1)  # -inf on empty rows
    if dropout_p > 0.0:
        keep = torch.rand(probs.shape, device=q.device) >= dropout_p
        dropped = probs * keep * (0.0 if dropout_p >= 1.0 else 1.0 / (1.0 - dropout_p))
    else:
        keep = torch.ones_like(probs, dtype=torch.bool)
        dropped = probs
    out = torch.einsum("bhqk,bkhd->bqhd", dropped, vf).to(q.dtype)
    if return_attn_probs:
        s_dmask = torch.where(keep, probs, -probs).detach().to(q.dtype)
        return out, lse, s_dmask
    return (out, lse) if return_lse else out


def flash_attn_qkvpacked_func(qkv, *args, **kwargs):
    """qkv (B, S, 3, H, D)."""
    return flash_attn_func(*qkv.unbind(2), *args, **kwargs)


def flash_attn_kvpacked_func(q, kv, *args, **kwargs):
    """q (B, Sq, H, D); kv (B, Sk, 2, Hkv, D)."""
    return flash_attn_func(q, *kv.unbind(2), *args, **kwargs)


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
    return_lse=False,
):
    """q (total_q, H, D); k, v (total_k, Hkv, D), or with block_table (B, max_pages) a paged cache (pages, page,
    Hkv, D) whose sequence s has keys rows 0 .. cu_seqlens_k[s + 1] - cu_seqlens_k[s] - 1 through
    block_table[s]: flash_attn_func per sequence (a batch of one), assembled.
    Returns out, (out, lse (H, total_q)) or (out, lse, S_dmask (B, H, max_seqlen_q, max_seqlen_k))."""
    batch, nheads = cu_seqlens_q.shape[0] - 1, q.shape[1]
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs, lses = [], []
    s_dmask = torch.zeros(batch, nheads, max_seqlen_q, max_seqlen_k, dtype=q.dtype, device=q.device)
    for s in range(batch):
        slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes[s:s + 1]
        rows = slice(cu_q[s], cu_q[s + 1])
        if block_table is None:
            keys = slice(cu_k[s], cu_k[s + 1])
        else:
            r = torch.arange(cu_k[s + 1] - cu_k[s], device=q.device)
            keys = (block_table[s].long()[r // k.shape[1]], r % k.shape[1])
        out, lse, probs = flash_attn_func(q[None, rows], k[keys][None], v[keys][None], dropout_p, softmax_scale,
                                          causal, window_size, softcap, slopes, deterministic, return_attn_probs=True)
        outs.append(out[0])
        lses.append(lse[0])
        s_dmask[s, :, :probs.shape[2], :probs.shape[3]] = probs[0]
    out, lse = torch.cat(outs), torch.cat(lses, dim=1)
    if return_attn_probs:
        return out, lse, s_dmask
    return (out, lse) if return_lse else out


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, *args, **kwargs):
    """qkv (total, 3, H, D)."""
    return flash_attn_varlen_func(*qkv.unbind(1), cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, *args, **kwargs)


def flash_attn_varlen_kvpacked_func(q, kv, *args, **kwargs):
    """q (total_q, H, D); kv (total_k, 2, Hkv, D)."""
    return flash_attn_varlen_func(q, *kv.unbind(1), *args, **kwargs)


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
    """q (B, Sq, H, D); k_cache, v_cache (B_cache, S, Hkv, D), or paged (pages, page, Hkv, D) with block_table.
    New k, v (rotated by the stand-in flash_attn.layers.rotary) written at cache rows cache_seqlens[b] + i (rows
    past the cache dropped), then flash_attn_func per sequence on its cache rows [cache_leftpad[b],
    cache_seqlens[b] + seqlen_new). Host loops over the batch. Returns out or (out, lse (B, H, Sq))."""
    from flash_attn.layers.rotary import apply_rotary_emb

    batch, seqlen_q, nheads, headdim = q.shape
    page = k_cache.shape[1] if block_table is not None else None
    seqlen_k = block_table.shape[1] * page if block_table is not None else k_cache.shape[1]
    if cache_seqlens is None:
        lengths = [seqlen_k] * batch
    elif isinstance(cache_seqlens, int):
        lengths = [cache_seqlens] * batch
    else:
        lengths = cache_seqlens.tolist()
    start = [min(max(n, 0), seqlen_k) for n in lengths]
    leftpad = [0] * batch if cache_leftpad is None else cache_leftpad.tolist()

    def slots(b, rows):  # cache indices of a sequence's rows (a 1-D long tensor)
        if block_table is not None:
            return block_table[b].long()[rows // page], rows % page
        return torch.full_like(rows, b if cache_batch_idx is None else int(cache_batch_idx[b])), rows

    seqlen_new = 0 if k is None else k.shape[1]
    if k is not None:
        offsets = torch.tensor(start, device=q.device)
        if rotary_cos is not None:
            if causal or any(0 <= w < seqlen_k for w in window_size):
                q = apply_rotary_emb(q, rotary_cos, rotary_sin, rotary_interleaved, seqlen_offsets=offsets)
            else:  # every query at position cache_seqlens[b]
                flat = apply_rotary_emb(q.reshape(batch, 1, seqlen_q * nheads, headdim), rotary_cos, rotary_sin,
                                        rotary_interleaved, seqlen_offsets=offsets)
                q = flat.reshape(q.shape)
            k = apply_rotary_emb(k, rotary_cos, rotary_sin, rotary_interleaved, seqlen_offsets=offsets)
        for b in range(batch):
            n = max(0, min(seqlen_new, seqlen_k - start[b]))
            rows = torch.arange(start[b], start[b] + n, device=q.device)
            k_cache[slots(b, rows)] = k[b, :n]
            v_cache[slots(b, rows)] = v[b, :n]
    outs, lses = [], []
    for b in range(batch):
        end = min(start[b] + seqlen_new, seqlen_k)
        rows = torch.arange(min(max(leftpad[b], 0), end), end, device=q.device)
        slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes[b:b + 1]
        out, lse = flash_attn_func(q[b:b + 1], k_cache[slots(b, rows)][None], v_cache[slots(b, rows)][None], 0.0,
                                   softmax_scale, causal, window_size, softcap, slopes, return_lse=True)
        outs.append(out)
        lses.append(lse)
    out, lse = torch.cat(outs), torch.cat(lses)
    return (out, lse) if return_softmax_lse else out
