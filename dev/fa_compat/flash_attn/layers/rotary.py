"""flash_attn.layers.rotary of the stand-in package: apply_rotary_emb, which flash-attn's KV-cache test
uses to build its reference (flash-attn's own module needs its Triton kernels, so it is not fetched).

Written here in plain torch with flash-attn's contract, and in the rotate-half form (x * cos + rotate(x) *
sin), not the form of flashattn_ext.kvcache.apply_rotary, so that the test's reference stays independent of
the code it checks."""
import torch


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
                     max_seqlen=None):
    """x (batch, seqlen, nheads, headdim); cos, sin (seqlen_rotary, rotary_dim / 2). Token i of batch row b
    is rotated by the angles of row i + seqlen_offsets[b] (seqlen_offsets: an int or an int (batch,) tensor);
    rows past seqlen_rotary leave it unrotated (as flash-attn's kernel, which masks its loads there). The
    first rotary_dim channels rotate: pairs (2c, 2c + 1) when interleaved (GPT-J), else halves (c, c +
    rotary_dim / 2) (GPT-NeoX); the rest pass through. Computed in float32, returned in x's dtype."""
    if cu_seqlens is not None:
        raise NotImplementedError("apply_rotary_emb: cu_seqlens is not used by flash-attn's tests")
    batch, seqlen = x.shape[:2]
    rotary_dim = 2 * cos.shape[1]
    offsets = torch.as_tensor(seqlen_offsets, device=x.device).long().reshape(-1, 1)
    rows = offsets.expand(batch, 1) + torch.arange(seqlen, device=x.device)  # (batch, seqlen)
    inside = (rows < cos.shape[0])[..., None, None]
    rows = rows.clamp(max=cos.shape[0] - 1)
    c, s = cos.float()[rows][:, :, None, :], sin.float()[rows][:, :, None, :]  # (batch, seqlen, 1, dim / 2)
    if interleaved:
        c, s = c.repeat_interleave(2, dim=-1), s.repeat_interleave(2, dim=-1)
    else:
        c, s = torch.cat((c, c), dim=-1), torch.cat((s, s), dim=-1)
    c = torch.where(inside, c, torch.ones_like(c))
    s = torch.where(inside, s, torch.zeros_like(s))
    xr = x[..., :rotary_dim].float()
    if interleaved:
        pairs = xr.unflatten(-1, (-1, 2))
        turned = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    else:
        first, second = xr.chunk(2, dim=-1)
        turned = torch.cat((-second, first), dim=-1)
    out = torch.cat(((xr * c + turned * s).to(x.dtype), x[..., rotary_dim:]), dim=-1)
    if inplace:
        x.copy_(out)
        return x
    return out
