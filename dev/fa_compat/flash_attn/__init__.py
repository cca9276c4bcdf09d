"""A stand-in `flash_attn` package that runs flash-attn's own tests against flashattn_ext.

It exports flash-attn's public names from `flash_attn.flash_attn_interface` (this folder's module,
which maps them onto flashattn_ext.flash_attn_func or skips what flashattn_ext lacks) and takes the
helper modules that flash-attn's tests import from flash-attn itself, as fetched by
dev/fetch_flash_attn_tests.sh into dev/third_party/flash_attn-<version>/flash_attn/ (not committed):
that folder is appended to this package's search path, after this one, so that
`flash_attn.bert_padding` is flash-attn's file while `flash_attn.flash_attn_interface` stays ours.
"""
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_DEFAULT_SRC = os.path.join(_HERE, "..", "..", "third_party", "flash_attn-2.8.3")
FA_SRC = os.path.abspath(os.environ.get("FA_SRC", _DEFAULT_SRC))
_FETCHED_PACKAGE = os.path.join(FA_SRC, "flash_attn")
if not os.path.isdir(_FETCHED_PACKAGE):
    raise ImportError(
        f"flash-attn's helper modules are not at {_FETCHED_PACKAGE}: run dev/fetch_flash_attn_tests.sh "
        "(or set FA_SRC to the fetched flash_attn-<version> folder)"
    )
__path__.append(_FETCHED_PACKAGE)

__version__ = "flashattn_ext-shim"

from flash_attn.flash_attn_interface import (  # noqa: E402
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
]
