"""flash_attn.layers.rotary of the stand-in package. flash-attn's tests use rotary embeddings only
in the KV-cache test, which flashattn_ext does not support (flash-attn's module needs its Triton
kernels, so it is not fetched): apply_rotary_emb skips the calling test."""
import pytest

from flash_attn.flash_attn_interface import KVCACHE_REASON


def apply_rotary_emb(*args, **kwargs):
    pytest.skip(f"not supported: {KVCACHE_REASON}")
