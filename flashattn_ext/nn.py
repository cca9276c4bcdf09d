"""Attention modules on flashattn_ext's kernels.

    mha = flashattn_ext.nn.MultiheadAttention(512, 8, batch_first=True)   # torch.nn.MultiheadAttention's API
    out, _ = mha(x, x, x, key_padding_mask=pad, need_weights=False)
    attn = flashattn_ext.nn.Attention(512, 8, num_kv_heads=2, rotary=True)   # for new models: (B, S, dim) -> same
    y = attn(x)

MultiheadAttention takes torch.nn.MultiheadAttention's constructor and forward arguments and has its
parameters (in_proj_weight (3E, E), or q_proj_weight (E, E), k_proj_weight (E, kdim) and v_proj_weight
(E, vdim) when kdim or vdim differs from E; in_proj_bias (3E,), bias_k and bias_v (1, 1, E) with
add_bias_kv, out_proj.weight (E, E), out_proj.bias (E,)) with the same initialization, so a state dict
loads either way and the same seed gives the same weights; the attention weights (need_weights=True,
torch's default) come from an extra eager pass, the output from the kernel.
Attention is a compact self-attention block: one fused qkv projection, grouped-query heads, optional
rotary position embedding, causal and sliding-window bands, dropout; its forward calls attend(), the
one method to override to put another kernel under the same parameters.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

from . import _core
from ._checks import (_check_bools, _check_dropout, _check_mask, _check_rel_bias, _check_softcap, _check_window,
                      _default_scale)
from .interface import _attention, flash_attn_func
from .reference import dropout_scale

_NO_WINDOW = (-1, -1)


def _visibility(mask, name, dtype):
    """A torch-convention mask (bool True = masked out, or additive float) -> flashattn_ext's (bool True =
    takes part, or additive float in dtype)."""
    if mask.dtype == torch.bool:
        return ~mask
    if not mask.is_floating_point():
        raise TypeError(f"MultiheadAttention: {name} must be bool or floating point, got {mask.dtype}")
    return mask.to(dtype)


def _merge_masks(first, second, dtype):
    """The conjunction of two visibility masks (bool or additive float), broadcast."""
    if first is None or second is None:
        return first if second is None else second
    if first.dtype == torch.bool and second.dtype == torch.bool:
        return first & second

    def additive(mask):
        if mask.dtype != torch.bool:
            return mask
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, -math.inf)

    return additive(first) + additive(second)


def _visible(mask, count):
    """count more columns for mask (..., S): visible (bool True, float 0)."""
    shape = (*mask.shape[:-1], count)
    if mask.dtype == torch.bool:
        return torch.ones(shape, dtype=torch.bool, device=mask.device)
    return mask.new_zeros(shape)


def _attention_weights(q, k, mask, causal, scale, dropout_p, rng_state):
    """The attention weights (N, H, L, S) of q (N, L, H, D) and k (N, S, H, D) in q's dtype, eager: the
    softmax of the scaled scores under mask (visibility: bool True = attended, or additive float,
    broadcastable) and the top-left causal band; rows that attend to no key 0. With dropout_p > 0, the
    keep mask the kernel drew from rng_state, scaled as the kernel scales: weights @ v is the kernel's
    output."""
    scores = torch.einsum("nlhd,nshd->nhls", q * scale, k)
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask
    if causal:
        above = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(above, -math.inf)
    empty = torch.isneginf(scores).all(-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
    if dropout_p > 0.0:
        keep = _core.dropout_mask(q=q, rng_state=rng_state, seqlen_k=k.shape[1], dropout_p=dropout_p)
        weights = weights * keep * dropout_scale(dropout_p)
    return weights


class MultiheadAttention(nn.Module):
    """Drop-in for torch.nn.MultiheadAttention on flashattn_ext's kernels.

    Same constructor (kdim / vdim, add_bias_kv, add_zero_attn, batch_first, bias, dropout), parameters
    (in_proj_weight, or q_proj_weight / k_proj_weight / v_proj_weight when kdim or vdim differs from
    embed_dim; in_proj_bias, bias_k, bias_v, out_proj), initialization and forward(query, key, value,
    key_padding_mask, need_weights=True, attn_mask, average_attn_weights=True, is_causal) with torch's
    conventions: batch_first or (L, N, E) inputs (unbatched (L, E) too), key_padding_mask (N, S) and
    attn_mask (L, S) or (N * num_heads, L, S), bool True = NOT attended or additive float, both combinable.
    Returns (attn_output, attn_weights): the output from flashattn_ext's kernel; the weights, only with
    need_weights=True, by an extra eager pass (it materializes (N, num_heads, L, S), as torch does),
    averaged over the heads ((N, L, S)) or per head ((N, num_heads, L, S)) as average_attn_weights asks,
    with dropout the weights the kernel used (its keep mask, scaled); None with need_weights=False.
    Differences from torch (README.md, Modules, lists them too): is_causal=True needs no attn_mask (torch
    requires one as a hint): a square causal mask is applied; given together with attn_mask, it is trusted
    as torch trusts it (the kernels skip the tiles above the diagonal) unless add_bias_kv / add_zero_attn
    appended keys, where the mask is applied as given, the appended keys visible to every query (torch's
    need_weights=False path without a key_padding_mask hides them). A query that may attend to no key gets
    0 attention and 0 weights (torch: the same output with need_weights=False, NaN output and weights with
    need_weights=True). Dropout draws its own random numbers. torch's fused inference path is never taken
    (so NestedTensor inputs, which only it takes, raise). Errors are ValueError / TypeError.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None):
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"MultiheadAttention: embed_dim and num_heads must be > 0, got embed_dim={embed_dim} "
                             f"and num_heads={num_heads}")
        if embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim ({embed_dim}) must be divisible by num_heads "
                             f"({num_heads})")
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.add_zero_attn = add_zero_attn
        # Read by torch.nn.TransformerEncoder(Layer)'s inference fast path, which would call torch's fused
        # kernel with these weights: False keeps that path off, so this module's forward runs there too.
        self._qkv_same_embed_dim = False
        # Created in torch.nn.MultiheadAttention's order, so one seed gives both modules the same weights.
        if self.kdim == embed_dim and self.vdim == embed_dim:
            self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim, **factory))
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(name, None)
        else:
            self.q_proj_weight = nn.Parameter(torch.empty(embed_dim, embed_dim, **factory))
            self.k_proj_weight = nn.Parameter(torch.empty(embed_dim, self.kdim, **factory))
            self.v_proj_weight = nn.Parameter(torch.empty(embed_dim, self.vdim, **factory))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(3 * embed_dim, **factory))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias, **factory)
        if add_bias_kv:
            self.bias_k = nn.Parameter(torch.empty(1, 1, embed_dim, **factory))
            self.bias_v = nn.Parameter(torch.empty(1, 1, embed_dim, **factory))
        else:
            self.bias_k = self.bias_v = None
        self._reset_parameters()

    def _reset_parameters(self):
        for weight in (self.in_proj_weight, self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
            if weight is not None:
                nn.init.xavier_uniform_(weight)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)
        for extra in (self.bias_k, self.bias_v):
            if extra is not None:
                nn.init.xavier_normal_(extra)

    def _project(self, query, key, value, same_qkv, same_kv):
        """q (N, L, H, D), k and v (N, S, H, D), views of the projections; with in_proj_weight, one matmul
        for the inputs that are one tensor (same_qkv: query, key and value; same_kv: key and value)."""
        e, bias = self.embed_dim, self.in_proj_bias
        bias_q, bias_k, bias_v = (None, None, None) if bias is None else bias.split(e)
        heads = (self.num_heads, self.head_dim)
        if self.in_proj_weight is None:
            return (F.linear(query, self.q_proj_weight, bias_q).unflatten(-1, heads),
                    F.linear(key, self.k_proj_weight, bias_k).unflatten(-1, heads),
                    F.linear(value, self.v_proj_weight, bias_v).unflatten(-1, heads))
        weight = self.in_proj_weight
        if same_qkv:
            return F.linear(query, weight, bias).unflatten(-1, (3, *heads)).unbind(-3)
        q = F.linear(query, weight[:e], bias_q).unflatten(-1, heads)
        if same_kv:
            kv_bias = None if bias is None else bias[e:]
            k, v = F.linear(key, weight[e:], kv_bias).unflatten(-1, (2, *heads)).unbind(-3)
            return q, k, v
        return (q, F.linear(key, weight[e:2 * e], bias_k).unflatten(-1, heads),
                F.linear(value, weight[2 * e:], bias_v).unflatten(-1, heads))

    def _append_keys(self, k, v):
        """k, v (N, S, H, D) with bias_k / bias_v and then a zero key and value appended as keys S, S + 1
        (as torch: add_bias_kv, add_zero_attn)."""
        if self.bias_k is not None:
            k = torch.cat([k, self.bias_k.view(1, 1, *k.shape[2:]).expand(k.shape[0], 1, *k.shape[2:])], 1)
            v = torch.cat([v, self.bias_v.view(1, 1, *v.shape[2:]).expand(v.shape[0], 1, *v.shape[2:])], 1)
        if self.add_zero_attn:
            k, v = (torch.cat([t, t.new_zeros(t.shape[0], 1, *t.shape[2:])], 1) for t in (k, v))
        return k, v

    def _masks(self, attn_mask, key_padding_mask, batch, seqlen_q, seqlen_k, appended, dtype):
        """One visibility mask broadcastable to (N, H, L, S + appended), or None; the appended keys are
        visible to every query."""
        pad = None
        if key_padding_mask is not None:
            if tuple(key_padding_mask.shape) != (batch, seqlen_k):
                raise ValueError(f"MultiheadAttention: key_padding_mask must have shape (batch, source length) = "
                                 f"({batch}, {seqlen_k}), got {tuple(key_padding_mask.shape)}")
            pad = _visibility(key_padding_mask, "key_padding_mask", dtype)[:, None, None, :]
        mask = None
        if attn_mask is not None:
            shapes = {2: (seqlen_q, seqlen_k), 3: (batch * self.num_heads, seqlen_q, seqlen_k)}
            if tuple(attn_mask.shape) != shapes.get(attn_mask.dim()):
                raise ValueError(f"MultiheadAttention: attn_mask must have shape (L, S) = {shapes[2]} or "
                                 f"(batch * num_heads, L, S) = {shapes[3]}, got {tuple(attn_mask.shape)}")
            mask = _visibility(attn_mask, "attn_mask", dtype)
            mask = mask.view(batch, self.num_heads, seqlen_q, seqlen_k) if mask.dim() == 3 else mask[None, None]
        if appended:
            pad, mask = (None if m is None else torch.cat([m, _visible(m, appended)], -1) for m in (pad, mask))
        return _merge_masks(pad, mask, dtype)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        """query (L, N, E) ((N, L, E) with batch_first, (L, E) unbatched), key (S, N, kdim) and value (S, N,
        vdim) likewise. Returns (attn_output shaped like query, attn_weights (N, L, S) averaged over the heads
        or (N, num_heads, L, S) with average_attn_weights=False ((L, S) / (num_heads, L, S) unbatched), or
        None with need_weights=False); S counts the keys add_bias_kv and add_zero_attn append."""
        if query.is_nested or key.is_nested or value.is_nested:
            raise ValueError("MultiheadAttention: NestedTensor query, key or value is not supported (torch takes "
                             "them on its fused inference path only); pad the batch and pass key_padding_mask")
        _check_bools("MultiheadAttention", need_weights=need_weights, average_attn_weights=average_attn_weights,
                     is_causal=is_causal)
        same_qkv, same_kv = query is key and key is value, key is value
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:  # (L, N, E) -> (N, L, E) views
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        dims = (self.embed_dim, self.kdim, self.vdim)
        if (query.dim(), key.dim(), value.dim()) != (3, 3, 3) or tuple(t.shape[-1] for t in (query, key, value)) != \
                dims or key.shape[:2] != value.shape[:2] or query.shape[0] != key.shape[0]:
            raise ValueError(f"MultiheadAttention: query, key and value must be (L, N, E), (S, N, kdim), (S, N, vdim) "
                             f"((N, L, E) ... with batch_first; (L, E) ... unbatched) with (E, kdim, vdim) = {dims}; "
                             f"got {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
        batch, seqlen_q, seqlen_k = query.shape[0], query.shape[1], key.shape[1]
        appended = (self.bias_k is not None) + self.add_zero_attn
        if is_causal and attn_mask is None:
            if seqlen_q != seqlen_k:
                raise ValueError(f"MultiheadAttention: is_causal=True without attn_mask needs as many queries as "
                                 f"keys, got {seqlen_q} and {seqlen_k}")
            if appended:  # the causal mask, explicit: the appended keys stay visible, as with a given mask
                attn_mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=query.device).triu(1)
        causal = is_causal and seqlen_q == seqlen_k and not appended
        q, k, v = self._project(query, key, value, same_qkv, same_kv)
        k, v = self._append_keys(k, v)
        mask = self._masks(None if causal else attn_mask, key_padding_mask, batch, seqlen_q, seqlen_k, appended,
                           q.dtype)
        dropout_p = _check_dropout("MultiheadAttention", self.dropout) if self.training else 0.0
        scale = _default_scale(self.head_dim)
        shape = (batch, self.num_heads, seqlen_q, k.shape[1])
        full_mask = _check_mask("MultiheadAttention", mask, q.dtype, q.device, shape)
        out, _, rng_state = _attention(q, k, v, scale, causal, False, _NO_WINDOW, 0.0, None, None, full_mask,
                                       dropout_p, False)
        out = self.out_proj(out.flatten(-2))  # (N, L, E)
        weights = None
        if need_weights:
            weights = _attention_weights(q, k, mask, causal, scale, dropout_p, rng_state)
            if average_attn_weights:
                weights = weights.mean(1)
            if unbatched:
                weights = weights.squeeze(0)
        if unbatched:
            return out.squeeze(0), weights
        return (out if self.batch_first else out.transpose(0, 1)), weights


def rotary_embedding(x, positions, base):
    """x (B, S, H, D) rotated by position (rotate-half form, as GPT-NeoX and Llama): pairs (x[d], x[d + D/2])
    turn by positions * base^(-2d/D). positions: (S,) or (B, S) integers."""
    half = x.shape[-1] // 2
    inv_freq = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)  # (D/2,)
    angles = positions.to(torch.float32)[..., None] * inv_freq  # (S, D/2) or (B, S, D/2)
    angles = angles[..., None, :]  # broadcast over heads
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    """Self-attention for new models: x (B, S, dim) -> (B, S, dim).

    qkv: one Linear(dim, (num_heads + num_kv_heads) * head_dim + num_kv_heads * head_dim_v), output laid out as
    [q heads | k heads | v heads]; proj: Linear(num_heads * head_dim_v, dim). num_kv_heads < num_heads:
    grouped-query attention (a divisor of num_heads; 1: multi-query). head_dim: default dim // num_heads;
    head_dim_v: the head dim of v (and of each head's output), default head_dim (MLA-style models use a
    smaller one, e.g. 192 / 128); the softmax scale is 1 / sqrt(head_dim). causal: query i sees keys
    j <= i. window_size (left, right): i - left <= j <= i + right, -1 unbounded (flash_attn_func's
    convention; with causal, right is 0: window_size=(w - 1, 0) shows each token its last w tokens, itself
    included). rotary: rotary position embedding on q and k (rotary_base, rotate-half form) at positions
    0..S-1 or the `positions` passed to forward. dropout: on the attention weights in training mode.
    softcap > 0: scores become softcap * tanh(scores / softcap). rel_bias_buckets > 0: T5's relative position
    bias, a learnable float32 parameter `rel_bias` (num_heads, rel_bias_buckets), zero at init, with
    rel_bias_max_distance and rel_bias_bidirectional (default: not causal) as flash_attn_func's rel_bias (every
    dtype; on CUDA the float32 kernels).
    """

    def __init__(self, dim, num_heads, num_kv_heads=None, head_dim=None, bias=True, causal=True,
                 window_size=_NO_WINDOW, rotary=False, rotary_base=10000.0, dropout=0.0, softcap=0.0, device=None,
                 dtype=None, head_dim_v=None, rel_bias_buckets=0, rel_bias_max_distance=128,
                 rel_bias_bidirectional=None):
        super().__init__()
        _check_bools("Attention", causal=causal, rotary=rotary)
        window_size, softcap = _check_window("Attention", window_size), _check_softcap("Attention", softcap)
        dropout = _check_dropout("Attention", dropout)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads <= 0 or num_kv_heads <= 0 or num_heads % num_kv_heads:
            raise ValueError(f"Attention: num_heads ({num_heads}) must be a positive multiple of num_kv_heads "
                             f"({num_kv_heads})")
        if head_dim is None:
            if dim % num_heads:
                raise ValueError(f"Attention: dim ({dim}) is not a multiple of num_heads ({num_heads}); pass head_dim")
            head_dim = dim // num_heads
        if rotary and head_dim % 2:
            raise ValueError(f"Attention: rotary needs an even head_dim, got {head_dim}")
        head_dim_v = head_dim if head_dim_v is None else head_dim_v
        for name, d in (("head_dim", head_dim), ("head_dim_v", head_dim_v)):
            if isinstance(d, bool) or not isinstance(d, int) or d <= 0:
                raise ValueError(f"Attention: {name} must be a positive int, got {d!r}")
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim, self.head_dim_v = head_dim, head_dim_v
        self.causal, self.window_size, self.softcap, self.dropout = causal, window_size, softcap, dropout
        self.rotary, self.rotary_base = rotary, rotary_base
        factory = {"device": device, "dtype": dtype}
        self.qkv = nn.Linear(dim, (num_heads + num_kv_heads) * head_dim + num_kv_heads * head_dim_v, bias=bias,
                             **factory)
        self.proj = nn.Linear(num_heads * head_dim_v, dim, bias=bias, **factory)
        bidirectional = not causal if rel_bias_bidirectional is None else rel_bias_bidirectional
        _check_bools("Attention", rel_bias_bidirectional=bidirectional)
        if isinstance(rel_bias_buckets, bool) or not isinstance(rel_bias_buckets, int) or rel_bias_buckets < 0:
            raise ValueError(f"Attention: rel_bias_buckets must be an int >= 0 (0: none), got {rel_bias_buckets!r}")
        self.rel_bias_max_distance, self.rel_bias_bidirectional = rel_bias_max_distance, bidirectional
        self.rel_bias = None
        if rel_bias_buckets:
            self.rel_bias = nn.Parameter(torch.zeros(num_heads, rel_bias_buckets, device=device,
                                                     dtype=torch.float32))
            # the bucket count and max_distance checked now, as flash_attn_func will check them
            _check_rel_bias("Attention", self.rel_bias.detach(), rel_bias_max_distance, bidirectional,
                            self.rel_bias.new_empty(1, 1, num_heads, 1), num_heads, None, 1)

    def attend(self, q, k, v, attn_mask=None):
        """The attention core: q (B, S, H, D), k (B, S, Hkv, D) and v (B, S, Hkv, Dv) -> (B, S, H, Dv). Override
        it to run another kernel under the same parameters."""
        return flash_attn_func(q, k, v, dropout_p=self.dropout if self.training else 0.0, causal=self.causal,
                               window_size=self.window_size, softcap=self.softcap, attn_mask=attn_mask,
                               rel_bias=self.rel_bias, rel_bias_max_distance=self.rel_bias_max_distance,
                               rel_bias_bidirectional=self.rel_bias_bidirectional)

    def forward(self, x, attn_mask=None, positions=None):
        """x (B, S, dim). attn_mask: bool (True = take part) or additive float, broadcastable to
        (B, num_heads, S, S), combined with the causal and window bands (e.g. mask[:, None, None, :] for a
        (B, S) key padding mask). positions: (S,) or (B, S) rotary positions, default 0..S-1."""
        dim = self.qkv.in_features
        if x.is_nested or x.dim() != 3 or x.shape[-1] != dim:
            raise ValueError(f"Attention: x must be a (batch, seqlen, dim) tensor with dim = {dim}, got "
                             f"{'a NestedTensor' if x.is_nested else tuple(x.shape)}")
        seqlen = x.shape[1]
        dims = (self.head_dim, self.head_dim, self.head_dim_v)
        sizes = [heads * d for heads, d in zip((self.num_heads, self.num_kv_heads, self.num_kv_heads), dims)]
        q, k, v = (t.unflatten(-1, (-1, d)) for t, d in zip(self.qkv(x).split(sizes, dim=-1), dims))
        if self.rotary:
            if positions is None:
                positions = torch.arange(seqlen, device=x.device)
            q, k = rotary_embedding(q, positions, self.rotary_base), rotary_embedding(k, positions, self.rotary_base)
        return self.proj(self.attend(q, k, v, attn_mask).flatten(-2))
