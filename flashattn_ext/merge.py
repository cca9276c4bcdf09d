"""merge_attention_states: the exact combine of two partial attentions over disjoint key sets (the seed
documents' merge; the building block of split-KV, ring attention and prefix caching).

For one query row with partial results (o_a, lse_a) over keys A and (o_b, lse_b) over keys B (A and B
disjoint), attention over A ∪ B is
    lse = log(exp(lse_a) + exp(lse_b))
    out = o_a * exp(lse_a - lse) + o_b * exp(lse_b - lse)
A side that saw no key has lse = -inf and weight 0; when both did, out = 0 and lse = -inf (never NaN, in
the forward or in the gradients). Written with torch ops: CPU and CUDA, any float dtype, differentiable
in all four inputs, traceable by torch.compile."""
import torch


def _check(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"merge_attention_states: {name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"merge_attention_states: {name} must be floating point, got {t.dtype}")


def merge_attention_states(out_a, lse_a, out_b, lse_b):
    """Merges (out_a, lse_a) and (out_b, lse_b) in either layout the functions return:
    - dense: out (batch, seqlen, nheads, headdim) as flash_attn_func returns it, lse (batch, nheads,
      seqlen) as return_lse gives it;
    - varlen: out (total, nheads, headdim) as flash_attn_varlen_func returns it, lse (nheads, total) as
      its return_lse gives it (the two halves from calls on the same cu_seqlens_q).
    Returns (out, lse) in the layout of the inputs: out in out_a's dtype, lse in the dtype of lse_a (the
    math runs in float32, float64 for float64 inputs)."""
    for name, t in (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)):
        _check(name, t)
    if out_a.shape != out_b.shape:
        raise ValueError(f"merge_attention_states: out_a {tuple(out_a.shape)} and out_b {tuple(out_b.shape)} differ")
    if lse_a.shape != lse_b.shape:
        raise ValueError(f"merge_attention_states: lse_a {tuple(lse_a.shape)} and lse_b {tuple(lse_b.shape)} differ")
    if out_a.dim() == 4:
        batch, seqlen, nheads, _ = out_a.shape
        layout, expected = "(batch, nheads, seqlen)", (batch, nheads, seqlen)
    elif out_a.dim() == 3:
        total, nheads, _ = out_a.shape
        layout, expected = "(nheads, total)", (nheads, total)
    else:
        raise ValueError(f"merge_attention_states: out_a must have 4 dimensions (batch, seqlen, nheads, headdim) or "
                         f"3 (total, nheads, headdim; varlen), got {out_a.dim()}")
    if tuple(lse_a.shape) != expected:
        raise ValueError(f"merge_attention_states: lse must have shape {layout} = {expected} for out of shape "
                         f"{tuple(out_a.shape)}, got {tuple(lse_a.shape)}")
    if len({t.device for t in (out_a, lse_a, out_b, lse_b)}) != 1:
        raise ValueError("merge_attention_states: all four tensors must be on one device")
    for side, out, lse in (("a", out_a, lse_a), ("b", out_b, lse_b)):
        if torch.is_grad_enabled() and out.requires_grad and not lse.requires_grad:
            raise ValueError(f"merge_attention_states: out_{side} requires grad but lse_{side} does not, so the "
                             f"merged gradient would miss lse_{side}'s part (flash_attn_varlen_func's lse carries no "
                             f"gradient; flash_attn_func's does): merge under torch.no_grad(), or detach out_{side}")
    work = torch.float64 if torch.float64 in (out_a.dtype, lse_a.dtype) else torch.float32
    la, lb = lse_a.to(work), lse_b.to(work)
    # lse = m + log(exp(la - m) + exp(lb - m)) with m = max(la, lb) detached (an identity, so the gradient is
    # exact) and 0 where both are -inf; a zero sum gives -inf through where(), not log(0), so that no NaN
    # reaches the gradient (torch.logaddexp's backward gives NaN at (-inf, -inf)).
    m = torch.maximum(la, lb).detach()
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    total = torch.exp(la - m) + torch.exp(lb - m)
    empty = total == 0
    lse = torch.where(empty, torch.full_like(m, float("-inf")), m + torch.log(torch.where(empty, torch.ones_like(total), total)))
    # Where both sides saw nothing, lse = -inf: subtract 0 instead, so both weights are exp(-inf) = 0 and
    # no inf - inf reaches the forward or the backward graph.
    ref = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    wa = torch.exp(la - ref).transpose(-1, -2).unsqueeze(-1)  # (batch, seqlen, nheads, 1) or (total, nheads, 1)
    wb = torch.exp(lb - ref).transpose(-1, -2).unsqueeze(-1)
    out = out_a.to(work) * wa + out_b.to(work) * wb
    return out.to(out_a.dtype), lse.to(lse_a.dtype)
