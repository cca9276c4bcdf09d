"""Eager attention with the semantics of flashattn_ext, for tests and for users who want a
readable reference. Materializes the (seqlen_q, seqlen_k) scores: use it on small inputs, in any
dtype (float64 for exact comparisons). Differentiable: autograd through it gives the reference
gradients of q, k, v, the sink and an additive attn_mask, with no NaN on rows that see no key."""
import math

import torch


def dropout_keep_probability(dropout_p):
    """1 - p_q, with p_q = round(p * 65536) / 65536: the kernels draw 16-bit numbers and keep an
    element iff its draw is >= round(p * 65536)."""
    return 1.0 - round(dropout_p * 65536) / 65536


def visible_band(seqlen_q, seqlen_k, causal=False, bottom_right=True, window_size=(-1, -1), device="cpu"):
    """(seqlen_q, seqlen_k) bool, True where query i sees key j by position: with offset =
    seqlen_k - seqlen_q (bottom_right, flash_attn_func) or 0 (top-left, torch's is_causal),
    i + offset - left <= j <= i + offset + right, -1 meaning unbounded; causal forces right = 0."""
    left, right = window_size
    if causal:
        right = 0
    offset = seqlen_k - seqlen_q if bottom_right else 0
    rel = (torch.arange(seqlen_k, device=device)[None, :] - torch.arange(seqlen_q, device=device)[:, None]) - offset
    band = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        band &= rel >= -left
    if right >= 0:
        band &= rel <= right
    return band


def _scores(q, k, softmax_scale, causal, bottom_right, window_size, softcap, alibi_slopes, attn_mask, dtype):
    """The final scores (batch, nheads, seqlen_q, seqlen_k) in dtype (hidden keys hold arbitrary values)
    and the bool `visible` of the same shape (band and mask)."""
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(headdim) if headdim > 0 else 1.0
    device = q.device
    group = nheads // nheads_kv
    qh = q.to(dtype).transpose(1, 2)  # (batch, nheads, seqlen_q, headdim)
    kh = k.to(dtype).transpose(1, 2).repeat_interleave(group, dim=1)  # (batch, nheads, seqlen_k, headdim)
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * softmax_scale  # (batch, nheads, seqlen_q, seqlen_k)
    if softcap > 0.0:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(device=device, dtype=dtype).reshape(-1, nheads)  # (1 or batch, nheads)
        rows = torch.arange(seqlen_q, device=device)[:, None]
        cols = torch.arange(seqlen_k, device=device)[None, :]
        dist = (rows + (seqlen_k - seqlen_q) - cols).abs().to(dtype)  # (seqlen_q, seqlen_k)
        scores = scores - slopes[:, :, None, None] * dist
    visible = visible_band(seqlen_q, seqlen_k, causal, bottom_right, window_size, device)
    visible = visible.expand(batch, nheads, seqlen_q, seqlen_k)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            visible = visible & attn_mask.to(device).expand(batch, nheads, seqlen_q, seqlen_k)
        else:
            scores = scores + attn_mask.to(device=device, dtype=dtype)
            visible = visible & (scores.detach() != -math.inf)
    return scores, visible


def attention_ref(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    bottom_right=True,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    sink=None,
    attn_mask=None,
    dropout_p=0.0,
    dropout_mask=None,
):
    """Returns (out, lse) for q (batch, seqlen_q, nheads, headdim), k/v (batch, seqlen_k, nheads_kv, headdim).

    causal / window_size: query i sees keys i + offset - left <= j <= i + offset + right, offset =
        seqlen_k - seqlen_q when bottom_right (flash_attn_func), 0 otherwise (torch's is_causal);
        -1 is unbounded; causal=True forces right = 0.
    softcap > 0: the scaled score s becomes softcap * tanh(s / softcap).
    alibi_slopes: (nheads,) or (batch, nheads): adds -slope * |i + seqlen_k - seqlen_q - j| (after softcap).
    attn_mask: bool (True = take part) or floating (added to the score), broadcastable to
        (batch, nheads, seqlen_q, seqlen_k).
    sink: (nheads,) logits: each row's softmax denominator gains exp(sink[h]); the sink takes
        probability mass but contributes no value.
    dropout_mask: (batch, nheads, seqlen_q, seqlen_k) bool keep mask (required when dropout_p > 0):
        the probabilities are multiplied by dropout_mask / (1 - p_q) before @ v.
    Rows that see no key: out 0, lse -inf (lse = sink with a sink), zero gradients.
    lse: (batch, nheads, seqlen_q) in q's dtype, the logsumexp of the row's final scores and the sink,
        taken before dropout.
    """
    batch, seqlen_q, nheads, _ = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    if dropout_p > 0.0 and dropout_mask is None:
        raise ValueError("attention_ref: dropout_p > 0 needs the keep mask as dropout_mask")
    dtype, device = q.dtype, q.device
    scores, visible = _scores(q, k, softmax_scale, causal, bottom_right, window_size, softcap, alibi_slopes,
                              attn_mask, dtype)
    vh = v.transpose(1, 2).repeat_interleave(nheads // nheads_kv, dim=1)  # (batch, nheads, seqlen_k, headdim)
    # Rows without a visible key: every score replaced by 0 (finite: no -inf - -inf anywhere, in the
    # forward or the backward graph), the probabilities zeroed by `visible` below.
    row_empty = ~visible.any(-1, keepdim=True)
    zero = torch.zeros((), dtype=dtype, device=device)
    masked = torch.where(visible, scores, torch.full((), -math.inf, dtype=dtype, device=device))
    masked = torch.where(row_empty, zero, masked)
    lse_keys = torch.logsumexp(masked, dim=-1, keepdim=True)  # finite on every row
    if sink is not None:
        sink_col = sink.to(device=device, dtype=dtype)[None, :, None, None]
        # a row without keys has only the sink: lse = sink
        lse = torch.where(row_empty, sink_col, torch.logaddexp(lse_keys, sink_col))
    else:
        lse = torch.where(row_empty, zero, lse_keys)
    probs = torch.where(visible, torch.exp(masked - lse), zero)  # exactly 0 on hidden keys
    if dropout_mask is not None:
        keep = dropout_mask.to(device=device, dtype=torch.bool).expand(batch, nheads, seqlen_q, seqlen_k)
        probs = torch.where(keep, probs / dropout_keep_probability(dropout_p), zero)
    out = torch.matmul(probs, vh).transpose(1, 2)  # (batch, seqlen_q, nheads, headdim)
    lse = lse.squeeze(-1)
    if sink is None:
        lse = torch.where(row_empty.squeeze(-1), torch.full((), -math.inf, dtype=dtype, device=device), lse)
    return out, lse


def attention_probs(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    bottom_right=True,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    sink=None,
    attn_mask=None,
    lse=None,
):
    """The softmax probabilities P (batch, nheads, seqlen_q, seqlen_k) before dropout, with the
    semantics of attention_ref (the sink's own probability is not a column), in float32 (float64 for
    float64 inputs). lse: (batch, nheads, seqlen_q), e.g. the one a kernel returned, so that P =
    exp(s - lse) on visible keys (0 elsewhere); None computes it here. v is unused (the signature
    follows attention_ref)."""
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    if lse is None:
        _, lse = attention_ref(q.to(dtype), k.to(dtype), k.new_zeros(k.shape[:3] + (1,), dtype=dtype), softmax_scale,
                               causal, bottom_right, window_size, softcap, alibi_slopes, sink, attn_mask)
    scores, visible = _scores(q, k, softmax_scale, causal, bottom_right, window_size, softcap, alibi_slopes,
                              attn_mask, dtype)
    lse = lse.to(device=scores.device, dtype=dtype)[..., None]
    finite = torch.isfinite(lse)
    shifted = torch.where(visible & finite, scores - torch.where(finite, lse, torch.zeros((), dtype=dtype,
                                                                                         device=lse.device)),
                          torch.full((), -math.inf, dtype=dtype, device=scores.device))
    return torch.exp(shifted)
