"""torch's flash-attention registry (torch >= 2.10): an implementation named "flashattn_ext" that
serves aten's flash-attention ops with our kernels.

    import flashattn_ext                                   # registers "flashattn_ext"; activates nothing
    torch.nn.attention.activate_flash_attention_impl("flashattn_ext")
    ...  # F.scaled_dot_product_attention (flash backend), varlen_attn, context_parallel, aten's flash ops
    torch.nn.attention.restore_flash_attention_impl()      # torch's own kernels again

Activation puts Python kernels on the CUDA key of aten::_flash_attention_forward, _flash_attention_backward,
_scaled_dot_product_flash_attention, _scaled_dot_product_flash_attention_backward (and
_flash_attention_forward_no_dropout_inplace where torch has it), as torch's FA3/FA4 providers do. Each
kernel maps the call onto flashattn_ext::fwd / ::bwd, or hands it, unchanged, to the kernel torch had
registered before (torch.library.get_kernel), with a one-time warning naming the reason.

Served: CUDA fp16/bf16 on dense 4-D batches, head dim <= 256 where the GPU offers the shared memory (the
limits of the extension: _C.limits()), any nheads / nheads_kv ratio, scale, is_causal (bottom-right aligned, as torch's FA2 kernel),
window_size_left/right, dropout, variable-length batches (cum_seq_q / cum_seq_k int32, 3-D inputs,
seqused_k in the forward; torch.nn.attention.varlen.varlen_attn). Falls back: seqused_k on a dense
batch, block_table, alibi_slopes (aten's backward does not carry them), return_debug_mask, other dtypes, a GPU
or head dim our build cannot run, dropout while a CUDA graph is being captured, and any argument a newer
torch adds that is not None.

Conventions (those of torch's FA2 kernel, which the ops' fake kernels describe):
- out / dq / dk / dv have the strides of torch.empty_like of query / key / value. Our kernels write
  (batch, seqlen, nheads, headdim)-contiguous outputs; where the caller's tensors are laid out
  (batch, nheads, seqlen, headdim), as SDPA's are, equal head counts and no dropout let the heads fold
  into the batch (views, no copy); otherwise the result is copied into that layout.
- lse (batch, nheads, seqlen_q) float32, contiguous. A row that sees no key has lse = -inf (torch's
  kernel writes +inf there); out and gradients are 0 either way.
- rng_state, unused: without dropout, uninitialized uint64 (2,) and () on the device, as torch's.
  With dropout, our forward returns its Philox (seed, offset) as a uint64 (2,) CPU tensor and a zero
  uint64 () CPU tensor; the backward regenerates the same keep mask from them. torch's kernel returns
  them on the GPU, which is how a backward tells whose forward ran: a dropout forward of torch's
  kernel (taken before activation, say) gets torch's backward, never ours with another mask.
"""
import functools
import itertools
import os
import warnings

import torch

from .. import _core
from .._checks import _default_scale

NAME = "flashattn_ext"

# What our kernels take (csrc/ops.cpp limits(): head dims, grid, dtypes, compute capability, shared memory).
_LIMITS = _core.LIMITS
_MAX_GRID_DIM = _LIMITS["max_grid_yz"]
_ATEN_DTYPES = (torch.float16, torch.bfloat16)

# What each device type serves through the registered kernels: on CUDA (what activation installs) those of
# our dtypes that aten's flash ops take; the CPU entry lets the tests run the same kernels through the
# dispatcher on a machine without a GPU.
_DTYPES = {device: tuple(getattr(torch, name) for name in names) for device, names in _LIMITS["dtypes"].items()}
_DTYPES["cuda"] = tuple(d for d in _DTYPES["cuda"] if d in _ATEN_DTYPES)

# Arguments of the ops as of torch 2.14 (2.11 lacks block_table and num_splits); num_splits only tunes
# torch's kernel. A name not listed here is an argument of a newer torch: a call that sets it falls back.
_FWD_ARGS = ("query", "key", "value", "cum_seq_q", "cum_seq_k", "max_q", "max_k", "dropout_p", "is_causal",
             "return_debug_mask")
_FWD_KWARGS = frozenset(("scale", "window_size_left", "window_size_right", "seqused_k", "alibi_slopes",
                         "block_table", "num_splits"))
_BWD_ARGS = ("grad_out", "query", "key", "value", "out", "logsumexp", "cum_seq_q", "cum_seq_k", "max_q", "max_k",
             "dropout_p", "is_causal", "rng_state", "unused")
_BWD_KWARGS = frozenset(("scale", "window_size_left", "window_size_right"))
_SDPA_ARGS = ("query", "key", "value", "dropout_p", "is_causal", "return_debug_mask")
_SDPA_KWARGS = frozenset(("scale",))
_SDPA_BWD_ARGS = ("grad_out", "query", "key", "value", "out", "logsumexp", "cum_seq_q", "cum_seq_k", "max_q",
                  "max_k", "dropout_p", "is_causal", "philox_seed", "philox_offset")
_INPLACE_ARGS = ("out",) + _FWD_ARGS

_ZERO_RNG = torch.zeros(2, dtype=torch.int64)  # the ops' rng_state when dropout_p == 0 (never read)
_warned = set()


# ------------------------------------------------------------------------------------------------
# Registration
# ------------------------------------------------------------------------------------------------

def _registry():
    """torch.nn.attention when it has the registry and torch.library.get_kernel (for the fallback)."""
    import torch.nn.attention as attention

    if hasattr(attention, "register_flash_attention_impl") and hasattr(torch.library, "get_kernel"):
        return attention
    return None


def register():
    """Registers "flashattn_ext" with torch's flash-attention registry, without activating it.
    Returns True when registered, False (doing nothing) on a torch without the registry. Idempotent."""
    attention = _registry()
    if attention is None:
        return False
    attention.register_flash_attention_impl(NAME, register_fn=_activate)
    return True


class _Handle:
    """What activation returns to the registry; remove() (restore_flash_attention_impl, or activating
    another implementation) takes our kernels off and torch's are back."""

    def __init__(self, library):
        self.library = library

    def remove(self):
        if self.library is not None:
            self.library._destroy()
            self.library = None


def cuda_kernels_built():
    """Whether this build of flashattn_ext has its CUDA kernels."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("flashattn_ext::fwd", "CUDA")


def _activate():
    if torch.version.hip is not None or not cuda_kernels_built():
        raise RuntimeError(
            "flashattn_ext: this build has no CUDA kernels (built without a CUDA toolkit, with "
            "FLASHATTN_EXT_FORCE_CPU=1, or for ROCm), so there is nothing to activate"
        )
    return _Handle(install("CUDA"))


def _schema_names(op):
    """(positional argument names, keyword-only argument names) of an aten op in this torch."""
    args = op._schema.arguments
    return tuple(a.name for a in args if not a.kwarg_only), frozenset(a.name for a in args if a.kwarg_only)


def _original(name, dispatch_key):
    try:
        return torch.library.get_kernel(f"aten::{name}", dispatch_key)
    except RuntimeError:  # torch has no kernel there (the CPU key): a fallback raises instead
        return None


def install(dispatch_key):
    """Puts our kernels on dispatch_key ("CUDA"; the tests also use "CPU") of every aten flash op this
    torch has and whose positional arguments are those we know. Returns the torch.library.Library
    holding them (its _destroy() takes them off)."""
    specs = (
        ("_flash_attention_forward", _FWD_ARGS, _FWD_KWARGS, _flash_forward_kernel),
        ("_flash_attention_backward", _BWD_ARGS, _BWD_KWARGS, _flash_backward_kernel),
        ("_scaled_dot_product_flash_attention", _SDPA_ARGS, _SDPA_KWARGS, _sdpa_forward_kernel),
        ("_scaled_dot_product_flash_attention_backward", _SDPA_BWD_ARGS, _SDPA_KWARGS, _sdpa_backward_kernel),
        ("_flash_attention_forward_no_dropout_inplace", _INPLACE_ARGS, _FWD_KWARGS, _inplace_forward_kernel),
    )
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        # "Overriding a previously registered kernel": the point of the registry.
        warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
        for name, positional, kwarg_only, body in specs:
            packet = getattr(torch.ops.aten, name, None)
            if packet is None:
                continue
            if _schema_names(packet.default)[0] != positional:
                continue  # a torch whose signature we do not know: its own kernel stays
            library.impl(name, _kernel(name, body, _original(name, dispatch_key), kwarg_only),
                         dispatch_key, with_keyset=True)
    return library


def _kernel(name, body, original, known_kwargs):
    """The registered function: body(*args, **kwargs) returns the result, or a reason (str) to run
    torch's kernel instead, which then gets the call exactly as it came."""

    def kernel(keyset, *args, **kwargs):
        unknown = sorted(k for k, v in kwargs.items() if k not in known_kwargs and v is not None)
        result = (f"argument {unknown[0]} (of a newer torch) is not served" if unknown
                  else body(*args, **kwargs))
        if not isinstance(result, str):
            return result
        if original is None:
            raise RuntimeError(f"flashattn_ext cannot serve aten::{name} ({result}) and torch has no kernel "
                               "for it on this device")
        _warn_once(name, result)
        return original.call_boxed(keyset, *args, **kwargs)

    kernel.__name__ = f"flashattn_ext_{name}"
    return kernel


def _warn_once(op, reason):
    if (op, reason) not in _warned:
        _warned.add((op, reason))
        warnings.warn(f"flashattn_ext: aten::{op} runs torch's own kernel: {reason}", UserWarning, stacklevel=3)


# ------------------------------------------------------------------------------------------------
# What we serve
# ------------------------------------------------------------------------------------------------

def build_info():
    """The generated flashattn_ext/_build_info.py (setup.py writes it), or None for a build without it."""
    try:
        from .. import _build_info
    except ImportError:
        return None
    return _build_info


def arch_runs_on(arch, capability):
    """Whether the code built for arch (setup.py's FLASHATTN_EXT_CUDA_ARCHS tokens: "80", "90a", "80+PTX",
    "compute_80") runs on a GPU of capability (major, minor): an arch-specific target ("90a") on that exact
    capability only, plain machine code on the same major revision at an equal or higher minor, PTX (which
    the driver compiles on first use) on every capability at or above its own."""
    ptx = arch.endswith("+PTX") or arch.startswith("compute_")
    number = arch.removeprefix("compute_").removesuffix("+PTX")
    major, minor = divmod(int(number.rstrip("a")), 10)
    if ptx:
        return tuple(capability) >= (major, minor)
    if number.endswith("a"):
        return (major, minor) == tuple(capability)
    return major == capability[0] and minor <= capability[1]


def smem_per_block(device_index):
    """The opt-in shared memory per block our kernels may use on that GPU (FLASHATTN_EXT_SMEM_LIMIT
    caps it, as in csrc/cuda/launch.cu)."""
    have = torch.cuda.get_device_properties(device_index).shared_memory_per_block_optin
    cap = int(os.environ.get("FLASHATTN_EXT_SMEM_LIMIT", "0") or 0)
    return min(have, cap) if cap > 0 else have


def cuda_smem_needed(headdim):
    """The shared memory per block (bytes) our fp16/bf16 forward and backward need at head dim headdim (at most
    limits' cuda_max_head_dim); 0 in a build without CUDA kernels."""
    return next((need for top, need in _LIMITS["cuda_smem"] if headdim <= top), 0)


def cuda_max_head_dim(smem):
    """The largest head dim up to which every head dim of our fp16/bf16 kernels runs with smem bytes of shared
    memory per block (0: none)."""
    fits = itertools.takewhile(lambda step: step[1] <= smem, _LIMITS["cuda_smem"])
    return max((top for top, _ in fits), default=0)


def _cuda_size_error(batch, nheads, headdim):
    """Why our CUDA kernels do not take these sizes, or None."""
    if headdim > _LIMITS["cuda_max_head_dim"]:
        return f"head dim {headdim} > {_LIMITS['cuda_max_head_dim']}"
    if batch > _MAX_GRID_DIM or nheads > _MAX_GRID_DIM:
        return f"batch or nheads above {_MAX_GRID_DIM}"
    return None


def _smem_error(headdim, smem):
    """Why a GPU offering smem bytes of shared memory per block does not run head dim headdim, or None."""
    need = cuda_smem_needed(headdim)
    return f"head dim {headdim} needs {need // 1024} KB of shared memory per block" if smem < need else None


@functools.lru_cache(maxsize=None)
def _cuda_device_error(device_index):
    """Why our kernels cannot run on that GPU at all, or None."""
    capability = torch.cuda.get_device_capability(device_index)
    if capability < _LIMITS["cuda_min_capability"]:
        return "compute capability {}.{} is below {}.{}".format(*capability, *_LIMITS["cuda_min_capability"])
    info = build_info()
    if info is not None and not any(arch_runs_on(a, capability) for a in info.CUDA_ARCHS):
        return (f"this build's CUDA archs ({', '.join(info.CUDA_ARCHS)}) do not run on compute capability "
                f"{capability[0]}.{capability[1]} (rebuild with FLASHATTN_EXT_CUDA_ARCHS)")
    return None


def _unsupported(query, key, value, dropout_p):
    """Why our kernels do not serve dense q (batch, seqlen_q, nheads, headdim), k/v (batch, seqlen_k,
    nheads_kv, headdim) in this call, or None."""
    device = query.device
    if key.device != device or value.device != device:
        return "query, key and value are on different devices"
    dtypes = _DTYPES.get(device.type, ())
    if query.dtype not in dtypes or key.dtype != query.dtype or value.dtype != query.dtype:
        return f"dtype {query.dtype} (served: {', '.join(str(d) for d in dtypes)}, one dtype for q, k, v)"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "inputs are not 4-D (batch, seqlen, nheads, headdim)"
    batch, _, nheads, headdim = query.shape
    if key.shape[3] != headdim or value.shape[3] != headdim:
        return "head dims of query, key and value differ"
    if key.shape[2] == 0 or nheads % key.shape[2] != 0 or key.shape[2] != value.shape[2]:
        return "nheads of query is not a multiple of nheads of key and value"
    if any(t.shape[3] > 1 and t.stride(3) != 1 for t in (query, key, value)):
        return "an input's last dimension is not contiguous"
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        error = _cuda_size_error(batch, nheads, headdim) or _cuda_device_error(index)
        if error is None:
            error = _smem_error(headdim, smem_per_block(index))
        if error is not None:
            return error
        if dropout_p > 0.0 and torch.cuda.is_current_stream_capturing():
            # A graph would replay the seed and offset of its capture: ours are host values, not device memory.
            return "dropout while a CUDA graph is being captured (our Philox seed and offset live on the host)"
    return None


def _varlen_unsupported(query, key, value, cum_seq_q, cum_seq_k, dropout_p):
    """Why our kernels do not serve a variable-length call, q (total_q, nheads, headdim), k/v (total_k,
    nheads_kv, headdim) with int32 cum_seq_q / cum_seq_k (batch + 1), or None."""
    if cum_seq_q is None or cum_seq_k is None:
        return "only one of cum_seq_q / cum_seq_k is given"
    if query.dim() != 3 or key.dim() != 3 or value.dim() != 3:
        return "variable-length inputs are not 3-D (total, nheads, headdim)"
    for name, t in (("cum_seq_q", cum_seq_q), ("cum_seq_k", cum_seq_k)):
        if t.dtype != torch.int32 or t.dim() != 1 or t.device != query.device:
            return f"{name} is not a 1-D int32 tensor on the device of query"
    if cum_seq_q.shape != cum_seq_k.shape or cum_seq_q.numel() < 2:
        return "cum_seq_q and cum_seq_k differ in length or hold no sequence"
    if cum_seq_q.numel() - 1 > _MAX_GRID_DIM:
        return f"more than {_MAX_GRID_DIM} sequences"
    return _unsupported(query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0), dropout_p)


def _forward_unsupported(query, key, value, cum_seq_q, cum_seq_k, dropout_p, return_debug_mask, kwargs):
    for name in ("block_table", "alibi_slopes"):
        if kwargs.get(name) is not None:
            return f"{name} is not served"
    if return_debug_mask:
        return "return_debug_mask"
    if cum_seq_q is not None or cum_seq_k is not None:
        return _varlen_unsupported(query, key, value, cum_seq_q, cum_seq_k, dropout_p)
    if kwargs.get("seqused_k") is not None:
        return "seqused_k on a dense batch is not served"
    return _unsupported(query, key, value, dropout_p)


def _is_our_rng(t):
    return t.device.type == "cpu" and t.dtype == torch.uint64 and tuple(t.shape) == (2,)


def _backward_unsupported(query, key, value, cum_seq_q, cum_seq_k, dropout_p, rng_state):
    ours = dropout_p > 0.0 and _is_our_rng(rng_state)
    if dropout_p > 0.0 and not ours:
        return "its forward ran torch's kernel (dropout masks must match)"
    if cum_seq_q is not None or cum_seq_k is not None:
        reason = _varlen_unsupported(query, key, value, cum_seq_q, cum_seq_k, dropout_p)
    else:
        reason = _unsupported(query, key, value, dropout_p)
    if reason is not None and ours:
        raise RuntimeError(f"flashattn_ext: the backward of our dropout forward cannot run ({reason}); torch's "
                           "kernel would draw another dropout mask")
    return reason


# ------------------------------------------------------------------------------------------------
# The mapping onto flashattn_ext::fwd / ::bwd (device-agnostic: the tests run it on CPU tensors)
# ------------------------------------------------------------------------------------------------

def _window(w):
    """aten's window size (None or < 0: unbounded) -> ours (-1: unbounded)."""
    return -1 if w is None or w < 0 else int(w)


def _scale(scale, query):
    return _default_scale(query.shape[-1]) if scale is None else float(scale)


def _layout_of(like):
    """The strides torch.empty_like(like) gets (those the ops' fake kernels give their outputs)."""
    return torch.empty_like(like, device="meta").stride()


def _in_layout(t, like):
    """t (same shape as like) with the strides of torch.empty_like(like): t itself, a view of it where
    only strides of size-1 dimensions differ, or a copy."""
    want = _layout_of(like)
    if t.stride() == want:
        return t
    if all(n <= 1 or a == b for n, a, b in zip(t.shape, t.stride(), want)):
        return t.as_strided(t.shape, want)
    result = torch.empty_like(like, dtype=t.dtype)
    result.copy_(t)
    return result


def _heads_major(like):
    """Whether torch.empty_like(like) of a (batch, seqlen, nheads, headdim) tensor is laid out
    (batch, nheads, seqlen, headdim)-contiguous."""
    batch, seqlen, nheads, headdim = like.shape
    want = (nheads * seqlen * headdim, headdim, seqlen * headdim, 1)
    return all(n <= 1 or a == b for n, a, b in zip(like.shape, _layout_of(like), want))


def _mergeable(t):
    """Whether batch and nheads of a (batch, seqlen, nheads, headdim) tensor merge into one dimension
    as a view."""
    batch, _, nheads, _ = t.shape
    return batch == 1 or nheads == 1 or t.stride(0) == nheads * t.stride(2)


def _fold(t):
    """(batch, seqlen, nheads, headdim) -> the view (batch * nheads, seqlen, 1, headdim)."""
    batch, seqlen, nheads, headdim = t.shape
    return t.transpose(1, 2).reshape(batch * nheads, seqlen, headdim).unsqueeze(2)


def _unfold(t, batch, nheads):
    """(batch * nheads, seqlen, 1, headdim) contiguous -> the view (batch, seqlen, nheads, headdim)."""
    return t.view(batch, nheads, t.shape[1], t.shape[3]).transpose(1, 2)


def _folds(query, key, value, dropout_p):
    """Whether to run with the heads folded into the batch, so that our (batch, seqlen, nheads,
    headdim)-contiguous outputs come out (batch, nheads, seqlen, headdim)-contiguous: equal head counts,
    no dropout (its Philox counters follow the (batch, head) indices), inputs laid out heads-major."""
    batch, _, nheads, _ = query.shape
    return (dropout_p == 0.0 and key.shape[2] == nheads and batch * nheads <= _MAX_GRID_DIM
            and _heads_major(query) and all(_mergeable(t) for t in (query, key, value)))


def flash_forward(query, key, value, dropout_p, is_causal, scale=None, window_size_left=None,
                  window_size_right=None):
    """aten::_flash_attention_forward on dense inputs, q (batch, seqlen_q, nheads, headdim), k/v
    (batch, seqlen_k, nheads_kv, headdim), through flashattn_ext::fwd. Returns (out, lse, rng_state,
    unused) in aten's conventions (module docstring)."""
    softmax_scale = _scale(scale, query)
    window = (_window(window_size_left), _window(window_size_right))
    deterministic = torch.are_deterministic_algorithms_enabled()
    if _folds(query, key, value, dropout_p):
        batch, seqlen_q, nheads, _ = query.shape
        out, lse, rng = _core.fwd(q=_fold(query), k=_fold(key), v=_fold(value), softmax_scale=softmax_scale,
                                  causal=bool(is_causal), window_left=window[0], window_right=window[1],
                                  deterministic=deterministic)
        out = _unfold(out, batch, nheads)
        lse = lse.view(batch, nheads, seqlen_q)
    else:
        out, lse, rng = _core.fwd(q=query, k=key, v=value, softmax_scale=softmax_scale, causal=bool(is_causal),
                                  window_left=window[0], window_right=window[1], dropout_p=float(dropout_p),
                                  deterministic=deterministic)
    return (_in_layout(out, query), lse) + _aten_rng(rng, dropout_p, query.device)


def flash_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, rng_state, scale=None,
                   window_size_left=None, window_size_right=None):
    """aten::_flash_attention_backward on dense inputs (layouts of flash_forward) through
    flashattn_ext::bwd. rng_state: flash_forward's (read when dropout_p > 0). Returns (dq, dk, dv)
    with the strides of torch.empty_like(query / key / value)."""
    softmax_scale = _scale(scale, query)
    window = (_window(window_size_left), _window(window_size_right))
    deterministic = torch.are_deterministic_algorithms_enabled()
    if _folds(query, key, value, dropout_p):
        batch, seqlen_q, nheads, _ = query.shape

        def folded(t):
            return _fold(t if _mergeable(t) else t.transpose(1, 2).contiguous().transpose(1, 2))

        dq, dk, dv, _, _ = _core.bwd(
            dout=folded(grad_out), q=_fold(query), k=_fold(key), v=_fold(value), out=folded(out),
            lse=logsumexp.reshape(batch * nheads, 1, seqlen_q), rng_state=_ZERO_RNG, softmax_scale=softmax_scale,
            causal=bool(is_causal), window_left=window[0], window_right=window[1], deterministic=deterministic)
        dq, dk, dv = (_unfold(t, batch, nheads) for t in (dq, dk, dv))
    else:
        rng = rng_state.view(torch.int64) if dropout_p > 0.0 else _ZERO_RNG
        dq, dk, dv, _, _ = _core.bwd(
            dout=grad_out, q=query, k=key, v=value, out=out, lse=logsumexp, rng_state=rng,
            softmax_scale=softmax_scale, causal=bool(is_causal), window_left=window[0], window_right=window[1],
            dropout_p=float(dropout_p), deterministic=deterministic)
    return _in_layout(dq, query), _in_layout(dk, key), _in_layout(dv, value)


def _aten_rng(rng, dropout_p, device):
    """Our rng_state -> aten's (rng_state, unused) (module docstring)."""
    if dropout_p > 0.0:
        return rng.view(torch.uint64), torch.zeros((), dtype=torch.uint64)
    return (torch.empty((2,), dtype=torch.uint64, device=device),
            torch.empty((), dtype=torch.uint64, device=device))


def varlen_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, scale=None,
                   window_size_left=None, window_size_right=None, seqused_k=None):
    """aten::_flash_attention_forward on a variable-length batch, q (total_q, nheads, headdim), k/v
    (total_k, nheads_kv, headdim), through flashattn_ext::fwd with cu_seqlens (is_causal and windows aligned
    bottom-right per sequence, as torch's kernel). Returns (out, lse (nheads, total_q), rng_state, unused)."""
    out, lse, rng = _core.varlen_fwd(
        q=query, k=key, v=value, cu_seqlens_q=cum_seq_q, cu_seqlens_k=cum_seq_k, seqused_k=seqused_k,
        max_seqlen_q=int(max_q), max_seqlen_k=int(max_k), softmax_scale=_scale(scale, query), causal=bool(is_causal),
        window_left=_window(window_size_left), window_right=_window(window_size_right), dropout_p=float(dropout_p),
        deterministic=torch.are_deterministic_algorithms_enabled())
    return (_in_layout(out, query), lse) + _aten_rng(rng, dropout_p, query.device)


def varlen_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                    is_causal, rng_state, scale=None, window_size_left=None, window_size_right=None):
    """aten::_flash_attention_backward on varlen_forward's layouts through flashattn_ext::bwd."""
    rng = rng_state.view(torch.int64) if dropout_p > 0.0 else _ZERO_RNG
    dq, dk, dv, _ = _core.varlen_bwd(
        dout=grad_out, q=query, k=key, v=value, out=out, lse=logsumexp, rng_state=rng, cu_seqlens_q=cum_seq_q,
        cu_seqlens_k=cum_seq_k, max_seqlen_q=int(max_q), max_seqlen_k=int(max_k), softmax_scale=_scale(scale, query),
        causal=bool(is_causal), window_left=_window(window_size_left), window_right=_window(window_size_right),
        dropout_p=float(dropout_p), deterministic=torch.are_deterministic_algorithms_enabled())
    return _in_layout(dq, query), _in_layout(dk, key), _in_layout(dv, value)


def sdpa_forward(query, key, value, dropout_p, is_causal, scale=None):
    """aten::_scaled_dot_product_flash_attention: q (batch, nheads, seqlen_q, headdim), k/v (batch,
    nheads_kv, seqlen_k, headdim). Returns its nine outputs."""
    out, lse, rng_state, unused = flash_forward(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                                dropout_p, is_causal, scale)
    return (out.transpose(1, 2), lse, None, None, query.shape[2], key.shape[2], rng_state, unused,
            _no_debug_mask(query))


def sdpa_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, philox_seed, scale=None):
    """aten::_scaled_dot_product_flash_attention_backward on sdpa_forward's layouts -> (dq, dk, dv)."""
    grads = flash_backward(*(t.transpose(1, 2) for t in (grad_out, query, key, value, out)), logsumexp, dropout_p,
                           is_causal, philox_seed, scale)
    return tuple(g.transpose(1, 2) for g in grads)


def _no_debug_mask(query):
    return torch.empty(0, dtype=query.dtype, device=query.device)


# ------------------------------------------------------------------------------------------------
# The registered bodies: the op's arguments -> its result, or the reason to fall back
# ------------------------------------------------------------------------------------------------

def _flash_forward_kernel(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                          return_debug_mask, **kwargs):
    reason = _forward_unsupported(query, key, value, cum_seq_q, cum_seq_k, dropout_p, return_debug_mask, kwargs)
    if reason is not None:
        return reason
    window = (kwargs.get("window_size_left"), kwargs.get("window_size_right"))
    if cum_seq_q is not None:
        result = varlen_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                                kwargs.get("scale"), *window, kwargs.get("seqused_k"))
    else:
        result = flash_forward(query, key, value, dropout_p, is_causal, kwargs.get("scale"), *window)
    return result + (_no_debug_mask(query),)


def _inplace_forward_kernel(out, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                            return_debug_mask, **kwargs):
    if dropout_p != 0.0:
        return "dropout_p != 0"
    reason = _forward_unsupported(query, key, value, cum_seq_q, cum_seq_k, dropout_p, return_debug_mask, kwargs)
    if reason is not None:
        return reason
    window = (kwargs.get("window_size_left"), kwargs.get("window_size_right"))
    if cum_seq_q is not None:
        result, lse, _, _ = varlen_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, 0.0, is_causal,
                                           kwargs.get("scale"), *window, kwargs.get("seqused_k"))
    else:
        result, lse, _, _ = flash_forward(query, key, value, 0.0, is_causal, kwargs.get("scale"), *window)
    out.copy_(result)
    return lse


def _flash_backward_kernel(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                           dropout_p, is_causal, rng_state, unused, **kwargs):
    reason = _backward_unsupported(query, key, value, cum_seq_q, cum_seq_k, dropout_p, rng_state)
    if reason is not None:
        return reason
    window = (kwargs.get("window_size_left"), kwargs.get("window_size_right"))
    if cum_seq_q is not None:
        return varlen_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                               dropout_p, is_causal, rng_state, kwargs.get("scale"), *window)
    return flash_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, rng_state,
                          kwargs.get("scale"), *window)


def _sdpa_forward_kernel(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, **kwargs):
    if return_debug_mask:
        return "return_debug_mask"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "inputs are not 4-D (batch, nheads, seqlen, headdim)"
    reason = _unsupported(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), dropout_p)
    if reason is not None:
        return reason
    return sdpa_forward(query, key, value, dropout_p, is_causal, kwargs.get("scale"))


def _sdpa_backward_kernel(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                          dropout_p, is_causal, philox_seed, philox_offset, **kwargs):
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "inputs are not 4-D (batch, nheads, seqlen, headdim)"
    reason = _backward_unsupported(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), cum_seq_q,
                                   cum_seq_k, dropout_p, philox_seed)
    if reason is not None:
        return reason
    return sdpa_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, philox_seed,
                         kwargs.get("scale"))
