"""torch.library registrations for the C++ ops flashattn_ext::fwd and flashattn_ext::bwd:
fake (meta) kernels for tracing, and the autograd formula of fwd, which saves q, k, v, out and lse
only and calls bwd."""
import torch


def _lse_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


@torch.library.register_fake("flashattn_ext::fwd")
def _fwd_fake(q, k, v, softmax_scale, causal, bottom_right, deterministic):
    batch, seqlen_q, nheads, _ = q.shape
    out = q.new_empty((batch, seqlen_q, nheads, v.shape[-1]))
    lse = q.new_empty((batch, nheads, seqlen_q), dtype=_lse_dtype(q.dtype))
    return out, lse


@torch.library.register_fake("flashattn_ext::bwd")
def _bwd_fake(dout, q, k, v, out, lse, softmax_scale, causal, bottom_right, deterministic):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal, bottom_right, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.softmax_scale = softmax_scale
    ctx.causal = causal
    ctx.bottom_right = bottom_right
    ctx.deterministic = deterministic
    # The gradient does not flow through lse (returned only for inspection and merging).
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.flashattn_ext.bwd(
        dout, q, k, v, out, lse, ctx.softmax_scale, ctx.causal, ctx.bottom_right, ctx.deterministic
    )
    return dq, dk, dv, None, None, None, None


torch.library.register_autograd("flashattn_ext::fwd", _backward, setup_context=_setup_context)
