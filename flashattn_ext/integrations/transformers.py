"""Hugging Face transformers: flashattn_ext as an attention implementation.

    from flashattn_ext.integrations.transformers import register
    name = register()                                    # "fa_ext"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=name)

register() adds `attention_forward` to transformers' AttentionInterface and, under the same name,
transformers' own `sdpa_mask` to its AttentionMaskInterface, so the model builds the masks it would
build for attn_implementation="sdpa":
- no mask (no padding, a causal or bidirectional pattern that needs none): the dense
  flash_attn_func path, with the layer's sliding window, softcap, sinks, dropout and scale;
- a mask (padding, decoding against a cache, packed sequences, a static cache): transformers' 4-D bool
  mask (batch, 1, seqlen_q, seqlen_k), True = take part, which already holds causality and the sliding
  window; it goes to flash_attn_func's attn_mask with softcap, sinks, dropout and scale, and no band
  of our own (a static cache's keys are not bottom-right aligned with the queries); the kernels skip
  the key tiles the mask hides entirely.

The name is "fa_ext", without "flash", on purpose: transformers (5.17 and 5.2x alike) treats any
implementation name that contains "flash" as a flash-attn kernel: from_config/from_pretrained fail
with "Could not find the currently requested flash attention implementation" (Llama), or gpt-oss
replaces the name by a hub kernel of its list and asks for the `kernels` package; names containing
"sdpa" or "flex_attention" get those backends' checks. A name free of those words is looked up in
AttentionInterface only, so our function runs on every model and version. Feeding our kernels to
transformers' own flash-attention path instead would tie us to its private unpadding helpers and
its flash_attn import checks, which change between versions.

Semantics mirror transformers' flash-attn and sdpa paths:
- sliding_window w: query i sees keys j with i - j < w (transformers' mask rule), i.e.
  window_size=(w - 1, w - 1) as transformers passes it to flash-attn, right = 0 when causal;
- is_causal: the keyword if given, else module.is_causal; with no mask and more keys than queries
  (the prefill of an empty static cache) the keys past seqlen_q are dropped, as transformers' sdpa
  path does, so the causal diagonal is top-left aligned like torch's is_causal;
- softcap (Gemma-2's attn_logit_softcapping), s_aux (gpt-oss sinks; differentiable), dropout (the
  models pass attention_dropout when module.training, else 0), scaling (softmax_scale);
- GQA/MQA natively (no repeat of k/v); a value head dim below the query's (MLA) is zero-padded and
  the output cropped, as transformers' flash path does.
Packed sequences without a mask (continuous batching's paged cache) raise NotImplementedError (no
varlen path yet); packed training batches work, as transformers builds their mask from position_ids.
Rows that see no key (left padding) give 0, where eager gives the mean of the values: only padded
positions differ. Returns (attn_output (batch, seqlen, nheads, headdim), None); attention weights
are never materialized (output_attentions=True warns).
"""
import warnings

import torch

from ..interface import flash_attn_func

DEFAULT_NAME = "fa_ext"
# Substrings that make transformers route a name to another backend's loading or checks.
_RESERVED_WORDS = ("flash", "sdpa", "flex_attention", "paged|")


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                      softcap=None, is_causal=None, s_aux=None, **kwargs):
    """transformers' attention-function signature: query (batch, nheads, seqlen_q, headdim), key/value
    (batch, nheads_kv, seqlen_k, headdim), attention_mask None or (batch, 1 or nheads, seqlen_q,
    seqlen_k) bool (True = take part) or additive float. Returns (out (batch, seqlen_q, nheads,
    headdim_v), None)."""
    if kwargs.get("output_attentions", False):  # Python's default filter shows it once
        warnings.warn("flashattn_ext does not return attention weights (output_attentions=True): they are None; "
                      "use attn_implementation='eager' to get them")
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # (batch, seqlen, heads, dim)
    headdim, headdim_v = q.shape[-1], v.shape[-1]
    if headdim_v < headdim:
        v = torch.nn.functional.pad(v, (0, headdim - headdim_v))
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    common = dict(dropout_p=float(dropout), softmax_scale=scaling, softcap=float(softcap or 0.0), s_aux=s_aux)
    if attention_mask is None:
        packed = kwargs.get("cu_seq_lens_q")
        if packed is not None and packed.numel() - 1 > q.shape[0]:
            raise NotImplementedError("flashattn_ext: several sequences packed in a batch row with no attention mask "
                                      "(continuous batching, a paged cache) need a varlen path, which flashattn_ext "
                                      "does not have yet")
        seqlen_q = q.shape[1]
        if causal and 1 < seqlen_q < k.shape[1]:
            k, v = k[:, :seqlen_q], v[:, :seqlen_q]
        window = (sliding_window - 1, sliding_window - 1) if sliding_window else (-1, -1)
        out = flash_attn_func(q, k, v, causal=causal, window_size=window, **common)
    else:
        out = flash_attn_func(q, k, v, attn_mask=attention_mask, **common)
    if headdim_v < headdim:
        out = out[..., :headdim_v]
    return out, None


def register(name=DEFAULT_NAME):
    """Register attention_forward (AttentionInterface) and transformers' sdpa mask builder
    (AttentionMaskInterface, where the installed transformers has it) under `name`; returns `name`,
    the value to pass as attn_implementation. Idempotent."""
    lowered = name.lower()
    for word in _RESERVED_WORDS:
        if word in lowered:
            raise ValueError(f"register: name {name!r} contains {word!r}, which makes transformers route it to "
                             f"another attention backend; choose a name without it (default {DEFAULT_NAME!r})")
    from transformers import AttentionInterface

    AttentionInterface.register(name, attention_forward)
    try:
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:  # older transformers build their 4-D masks without a registry
        return name
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
