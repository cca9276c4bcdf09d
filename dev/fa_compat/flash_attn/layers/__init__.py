"""flash_attn.layers of the stand-in package: only what flash-attn's tests import."""
