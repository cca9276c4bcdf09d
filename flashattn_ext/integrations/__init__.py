"""Adapters that plug flashattn_ext into other libraries; each imports its library lazily, on use.

    flashattn_ext.integrations.transformers.register()   # Hugging Face transformers
    flashattn_ext.integrations.torch_registry            # torch's flash-attention registry (import flashattn_ext registers it)
"""
