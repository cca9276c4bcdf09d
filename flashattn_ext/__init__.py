"""flashattn_ext: exact FlashAttention for PyTorch (C CPU kernels, CUDA kernels).

    out = flashattn_ext.flash_attn_func(q, k, v, causal=True)            # (batch, seqlen, nheads, headdim)
    out = flashattn_ext.scaled_dot_product_attention(q, k, v, is_causal=True)  # (batch, nheads, seqlen, headdim)
    out = flashattn_ext.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                               causal=True)                   # (total_tokens, nheads, headdim)
    out = flashattn_ext.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths,
                                                causal=True)  # decoding: appends k, v to the cache in place
"""
import torch  # noqa: F401  (first: _C links against libtorch)

from . import _C  # noqa: F401  (loads the library, which registers torch.ops.flashattn_ext.*)
from . import ops  # noqa: F401  (fake kernels and autograd for those ops)
from . import distributed  # noqa: F401
from . import nn  # noqa: F401
from . import reference
from .interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    scaled_dot_product_attention,
)
from .kvcache import flash_attn_with_kvcache
from .merge import merge_attention_states
from .integrations import torch_registry as _torch_registry

_torch_registry.register()  # "flashattn_ext" in torch's flash-attention registry; activates nothing

__version__ = "0.1.0"
__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "scaled_dot_product_attention",
    "merge_attention_states",
    "reference",
]
