"""Eager attention with the semantics of flashattn_ext (attention_ref; attention_varlen_ref per sequence
of a variable-length batch), for tests and for users who want a readable reference. Materializes the
(seqlen_q, seqlen_k) scores: use it on small inputs, in any dtype (float64 for exact comparisons).
Differentiable: autograd through it gives the reference gradients of q, k, v, the sink and an additive
attn_mask, with no NaN on rows that see no key."""
import math

import torch


def dropout_keep_probability(dropout_p):
    """1 - p: the kernels draw a 32-bit number per element and keep it iff the draw is >= round(p * 2^32),
    which keeps with probability 1 - p to within 2^-33."""
    return 1.0 - dropout_p


def dropout_scale(dropout_p):
    """The factor of a kept probability, as the kernels apply it: 1 / (1 - p) of p as given, in double;
    0 when nothing is kept (p >= 1 - 2^-33, p = 1 included: round(p * 2^32) = 2^32)."""
    return 0.0 if math.floor(dropout_p * 2.0 ** 32 + 0.5) >= 2 ** 32 else 1.0 / (1.0 - dropout_p)


def visible_band(seqlen_q, seqlen_k, causal=False, bottom_right=True, window_size=(-1, -1), device="cpu",
                 rows=None):
    """(seqlen_q, seqlen_k) bool, True where query i sees key j by position: with offset =
    seqlen_k - seqlen_q (bottom_right, flash_attn_func) or 0 (top-left, torch's is_causal),
    i + offset - left <= j <= i + offset + right, -1 meaning unbounded; causal forces right = 0.
    rows = (start, stop): only query rows start .. stop - 1, a (stop - start, seqlen_k) band."""
    left, right = window_size
    if causal:
        right = 0
    offset = seqlen_k - seqlen_q if bottom_right else 0
    start, stop = (0, seqlen_q) if rows is None else rows
    rel = (torch.arange(seqlen_k, device=device)[None, :] - torch.arange(start, stop, device=device)[:, None]) - offset
    band = torch.ones(stop - start, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        band &= rel >= -left
    if right >= 0:
        band &= rel <= right
    return band


def _scores(q, k, softmax_scale, causal, bottom_right, window_size, softcap, alibi_slopes, attn_mask, dtype,
            query_rows=None):
    """The final scores (batch, nheads, rows, seqlen_k) in dtype (hidden keys hold arbitrary values)
    and the bool `visible` of the same shape (band and mask); query_rows as attention_ref's."""
    batch, rows, nheads, headdim = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    start, seqlen_q = (0, rows) if query_rows is None else query_rows
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
        i = torch.arange(start, start + rows, device=device)[:, None]
        j = torch.arange(seqlen_k, device=device)[None, :]
        dist = (i + (seqlen_k - seqlen_q) - j).abs().to(dtype)  # (rows, seqlen_k)
        scores = scores - slopes[:, :, None, None] * dist
    visible = visible_band(seqlen_q, seqlen_k, causal, bottom_right, window_size, device, (start, start + rows))
    visible = visible.expand(batch, nheads, rows, seqlen_k)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            visible = visible & attn_mask.to(device).expand(batch, nheads, rows, seqlen_k)
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
    query_rows=None,
):
    """Returns (out, lse) for q (batch, seqlen_q, nheads, headdim), k (batch, seqlen_k, nheads_kv, headdim) and
    v (batch, seqlen_k, nheads_kv, headdim_v): out (batch, seqlen_q, nheads, headdim_v), headdim_v v's own.
    softmax_scale: default 1 / sqrt(headdim).

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
        the probabilities are multiplied by dropout_mask / (1 - p) (dropout_scale) before @ v.
    Rows that see no key: out 0, lse -inf (lse = sink with a sink), zero gradients.
    lse: (batch, nheads, seqlen_q) in q's dtype, the logsumexp of the row's final scores and the sink,
        taken before dropout.
    query_rows = (start, seqlen_q): q holds query rows start .. start + q.shape[1] - 1 of seqlen_q (the
        alignment of causal, window_size and alibi_slopes); attn_mask and dropout_mask then cover those
        rows only, and out / lse are theirs. None: q holds all rows.
    """
    batch, seqlen_q, nheads, _ = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    if dropout_p > 0.0 and dropout_mask is None:
        raise ValueError("attention_ref: dropout_p > 0 needs the keep mask as dropout_mask")
    dtype, device = q.dtype, q.device
    scores, visible = _scores(q, k, softmax_scale, causal, bottom_right, window_size, softcap, alibi_slopes,
                              attn_mask, dtype, query_rows)
    vh = v.transpose(1, 2).repeat_interleave(nheads // nheads_kv, dim=1)  # (batch, nheads, seqlen_k, headdim_v)
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
    # A row with a large |lse| holds log l only to an ulp of its maximum (a row at finfo.min, Hugging Face's padding:
    # lse = max, so exp(s - lse) is 1 per key): its probabilities are divided by their sum (the sink's included), as
    # torch's softmax and the kernels do (flash_cpu.c renorm_rows); every other row keeps exp(s - lse) bit for bit
    # (divided by 1). No data-dependent branch: attention_ref is traced (double_backward.py lse_vjp).
    wide = (lse.detach().abs() >= 1024) & torch.isfinite(lse.detach())
    mass = probs.sum(-1, keepdim=True)
    if sink is not None:
        mass = mass + torch.exp(sink_col - lse)
    probs = probs / torch.where(wide, mass, torch.ones((), dtype=dtype, device=device))
    if dropout_mask is not None:
        keep = dropout_mask.to(device=device, dtype=torch.bool).expand(batch, nheads, seqlen_q, seqlen_k)
        probs = torch.where(keep, probs * dropout_scale(dropout_p), zero)
    out = torch.matmul(probs, vh).transpose(1, 2)  # (batch, seqlen_q, nheads, headdim_v)
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


def varlen_sequences(cu_seqlens_q, cu_seqlens_k, seqused_k=None, max_seqlen_q=None, max_seqlen_k=None, total_q=None,
                     total_k=None):
    """The sequences of a variable-length batch as the kernels read them: a list of (q_row0, seqlen_q,
    k_row0, seqlen_k), one per sequence. Starts are clamped to [0, total], ends to [start, total] (total_q /
    total_k: the rows of q / k; None: unbounded), lengths to max_seqlen (None: unbounded), and seqused_k[s]
    (if given) to [0, seqlen_k]. Reads the index tensors on the host."""
    inf = math.inf
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    used = None if seqused_k is None else seqused_k.tolist()

    def clamp(x, lo, hi):
        return int(min(max(x, lo), hi))

    tq = inf if total_q is None else total_q
    tk = inf if total_k is None else total_k
    mq = inf if max_seqlen_q is None else max_seqlen_q
    mk = inf if max_seqlen_k is None else max_seqlen_k
    sequences = []
    for s in range(len(cu_q) - 1):
        q0, k0 = clamp(cu_q[s], 0, tq), clamp(cu_k[s], 0, tk)
        sq = int(min(clamp(cu_q[s + 1], q0, tq) - q0, mq))
        sk = int(min(clamp(cu_k[s + 1], k0, tk) - k0, mk))
        if used is not None:
            sk = clamp(used[s], 0, sk)
        sequences.append((q0, sq, k0, sk))
    return sequences


def attention_varlen_ref(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q=None,
    max_seqlen_k=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    sink=None,
    dropout_p=0.0,
    dropout_mask=None,
    seqused_k=None,
):
    """attention_ref per sequence of a variable-length batch (flash_attn_varlen_func's semantics): returns
    (out, lse) for q (total_q, nheads, headdim), k/v (total_k, nheads_kv, headdim), out (total_q, nheads,
    headdim_v) and lse (nheads, total_q) in q's dtype. Sequence s (varlen_sequences) is attention_ref of
    q[q_row0:q_row0 + seqlen_q][None] with k, v[k_row0:k_row0 + seqlen_k][None], aligned bottom-right, with
    alibi_slopes (nheads,) or row s of (batch, nheads), and dropout_mask[s, :, :seqlen_q, :seqlen_k] as its
    keep mask (dropout_mask: (batch, nheads, >= max seqlen_q, >= max seqlen_k) bool, e.g. the sign of
    flash_attn_varlen_func's S_dmask). Rows in no sequence: out 0, lse -inf. Differentiable (q, k, v, sink)."""
    total_q, nheads = q.shape[0], q.shape[1]
    out = q.new_zeros((total_q, nheads, v.shape[-1]))
    lse = torch.full((nheads, total_q), -math.inf, dtype=q.dtype, device=q.device)
    sequences = varlen_sequences(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, total_q,
                                 k.shape[0])
    for s, (q0, sq, k0, sk) in enumerate(sequences):
        if sq == 0:
            continue
        slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes[s:s + 1]
        keep = None if dropout_mask is None else dropout_mask[s:s + 1, :, :sq, :sk]
        o, l = attention_ref(q[None, q0:q0 + sq], k[None, k0:k0 + sk], v[None, k0:k0 + sk], softmax_scale, causal,
                             True, window_size, softcap, slopes, sink, None, dropout_p, keep)
        rows = torch.arange(q0, q0 + sq, device=q.device)
        out = out.index_copy(0, rows, o[0])
        lse = lse.index_copy(1, rows, l[0])
    return out, lse
