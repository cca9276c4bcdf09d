"""flashattn_ext.flash_attn_func's and flash_attn_varlen_func's contracts (and the packed forms) written
in plain torch (float32 math, autograd for the gradients), to check the adapter on its own:
FA_BACKEND=eager dev/run_fa_tests.sh ... runs flash-attn's tests against this instead of flashattn_ext's
kernels. A failure then is the adapter's (or a case that flash-attn's test itself cannot pass), not a
kernel's.

Dropout here draws its keep-mask with torch.rand, not flashattn_ext's Philox stream: flash-attn's
tests read the mask back from S_dmask, so any mask with the right keep probability serves.
"""
import math

import torch

DROPOUT_LEVELS = 65536  # flashattn_ext quantizes dropout_p to a multiple of 1/65536 (16-bit draws)


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
        p_q = round(dropout_p * DROPOUT_LEVELS) / DROPOUT_LEVELS
        keep = torch.rand(probs.shape, device=q.device) >= p_q
        dropped = probs * keep / (1.0 - p_q)
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
    return_lse=False,
):
    """q (total_q, H, D); k, v (total_k, Hkv, D): flash_attn_func per sequence (a batch of one), assembled.
    Returns out, (out, lse (H, total_q)) or (out, lse, S_dmask (B, H, max_seqlen_q, max_seqlen_k))."""
    batch, nheads = cu_seqlens_q.shape[0] - 1, q.shape[1]
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs, lses = [], []
    s_dmask = torch.zeros(batch, nheads, max_seqlen_q, max_seqlen_k, dtype=q.dtype, device=q.device)
    for s in range(batch):
        slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes[s:s + 1]
        rows, keys = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        out, lse, probs = flash_attn_func(q[None, rows], k[None, keys], v[None, keys], dropout_p, softmax_scale,
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
