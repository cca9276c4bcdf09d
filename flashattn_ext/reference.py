"""Eager attention with the semantics of flashattn_ext, for tests and for users who want a
readable reference. Materializes the (seqlen_q, seqlen_k) scores: use it on small inputs, in any
dtype (float64 for exact comparisons)."""
import math

import torch


def attention_ref(q, k, v, softmax_scale=None, causal=False, bottom_right=True):
    """Returns (out, lse) for q (batch, seqlen_q, nheads, headdim), k/v (batch, seqlen_k, nheads_kv, headdim).

    causal: query i sees keys j <= i + offset with offset = seqlen_k - seqlen_q when bottom_right
    (flash_attn_func), 0 otherwise (torch's is_causal). Rows that see no key: out 0, lse -inf.
    lse: (batch, nheads, seqlen_q) in q's dtype.
    """
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(headdim)
    group = nheads // nheads_kv
    qh = q.transpose(1, 2)  # (batch, nheads, seqlen_q, headdim)
    kh = k.transpose(1, 2).repeat_interleave(group, dim=1)  # (batch, nheads, seqlen_k, headdim)
    vh = v.transpose(1, 2).repeat_interleave(group, dim=1)
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * softmax_scale  # (batch, nheads, seqlen_q, seqlen_k)
    if causal:
        offset = seqlen_k - seqlen_q if bottom_right else 0
        rows = torch.arange(seqlen_q, device=q.device).unsqueeze(1)
        cols = torch.arange(seqlen_k, device=q.device).unsqueeze(0)
        scores = scores.masked_fill(cols > rows + offset, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # (batch, nheads, seqlen_q); -inf for rows with no key
    safe_lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    probs = torch.exp(scores - safe_lse.unsqueeze(-1))  # exactly 0 on masked keys
    out = torch.matmul(probs, vh).transpose(1, 2)  # (batch, seqlen_q, nheads, headdim)
    return out, lse
