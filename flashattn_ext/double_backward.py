"""The autograd of the backward: differentiating dq, dk, dv, d attn_mask and d sink (the outputs of the
backward op flashattn_ext::bwd (dense and varlen) and of ops._sink_grad) gives exact second derivatives,
and third and higher ones when grad mode is on.

The first-order backward is a function of (dout, q, k, v, sink, attn_mask) alone: out and lse, its other
inputs, are themselves functions of q, k, v, sink and attn_mask. Its vector-Jacobian product is computed
here as a composite of torch ops over blocks of query rows: each block recomputes its scores, softmax,
lse and out (reference.attention_ref on rows r0 .. r1 - 1, in the lse dtype), takes the block's
first-order gradients with autograd (create_graph), and differentiates them again against the incoming
cotangents. Because out and lse are recomputed, every path through them is covered by the gradients of
q, k, v, sink and attn_mask: the saved out and lse inputs get no gradient (they would count those paths
twice). ALiBi slopes are constants, as in the first-order backward.

At most one block of queries x seqlen_k scores (and the few tensors of that size the graph of one block
holds) is alive at a time, the block chosen from BLOCK_BYTES; with create_graph the graphs of all blocks
are kept for the next order. Dropout uses the keep mask of the first-order pass (the dropout_mask op on
the saved rng_state), which the op materializes for all rows at once as bool (1 byte per score). The
varlen backward reads cu_seqlens (and seqused_k) on the host once and runs the composite per sequence.

lse_vjp is the first-order gradient of the lse that fwd returns (the dense layout only: varlen's lse carries
no gradient), by the same blocks."""
import dataclasses

import torch

from . import _core
from ._checks import _lse_dtype
from .reference import attention_ref, varlen_sequences

# Bytes of one block's scores-sized tensors: the block holds query rows such that
# rows * batch * nheads * seqlen_k * (element size) * BLOCK_TENSORS <= the budget (at least one row).
# BLOCK_BYTES on the CPU (caches); CUDA_BLOCK_BYTES on a GPU, where each block costs a few hundred kernel
# launches and small blocks are launch-bound (H200, bf16 B1 H8 D64 S4k: 48 blocks of 85 rows, 36x eager's time).
BLOCK_BYTES = 1 << 28
CUDA_BLOCK_BYTES = 1 << 31
BLOCK_TENSORS = 24  # scores-sized tensors alive in the double-backward graph of one block (measured: 16-22)


def query_block(batch, nheads, seqlen_q, seqlen_k, dtype, device_type="cpu"):
    """The number of query rows per block (1 .. seqlen_q) for scores of (batch, nheads, rows, seqlen_k)."""
    per_row = max(1, batch * nheads * seqlen_k) * torch.finfo(_lse_dtype(dtype)).bits // 8 * BLOCK_TENSORS
    budget = BLOCK_BYTES if device_type == "cpu" else CUDA_BLOCK_BYTES
    return max(1, min(seqlen_q, budget // per_row))


@dataclasses.dataclass(frozen=True)
class Variant:
    """The non-tensor arguments of one call (those of a dense or varlen fwd)."""
    softmax_scale: float
    causal: bool
    bottom_right: bool
    window: tuple
    softcap: float
    dropout_p: float


def _point(x, create_graph):
    """Where to differentiate at: x itself when its graph continues (create_graph and x requires grad),
    else a detached leaf that requires grad."""
    if create_graph and x.requires_grad:
        return x
    return x.detach().requires_grad_()


def _zero_or(g, like):
    return torch.zeros_like(like) if g is None else g


def attention_vjp(q, k, v, dout, alibi_slopes, sink, attn_mask, keep, var, cotangents, needs, create_graph):
    """The vector-Jacobian product of the first-order backward of attention_ref (dense layout).

    q (batch, seqlen_q, nheads, headdim), k (batch, seqlen_k, nheads_kv, headdim), v (batch, seqlen_k, nheads_kv,
    headdim_v), dout like out (batch, seqlen_q, nheads, headdim_v);
    sink (nheads,) or None; attn_mask (batch, nheads, seqlen_q, seqlen_k) bool / floating or None; keep the
    dropout keep mask (batch, nheads, seqlen_q, seqlen_k) or None. cotangents: {"q", "k", "v", "sink",
    "mask"} -> the cotangent of dq, dk, dv, d sink, d attn_mask (missing or None: zero). needs: the names
    among "dout", "q", "k", "v", "sink", "mask" whose gradients to return. Returns {name: gradient}, each
    of its input's shape and dtype; differentiable when create_graph."""
    batch, seqlen_q, nheads, _ = q.shape
    seqlen_k = k.shape[1]
    acc = _lse_dtype(q.dtype)
    float_mask = attn_mask is not None and attn_mask.is_floating_point()
    cots = {name: g for name, g in cotangents.items() if g is not None}
    block = query_block(batch, nheads, seqlen_q, seqlen_k, q.dtype, q.device.type)
    alibi = None if alibi_slopes is None else alibi_slopes.detach()
    parts = {name: [] for name in needs}
    with torch.enable_grad():
        at = {"q": _point(q, create_graph), "k": _point(k, create_graph), "v": _point(v, create_graph),
              "dout": _point(dout, create_graph)}
        if sink is not None:
            at["sink"] = _point(sink, create_graph)
        mask = _point(attn_mask, create_graph) if float_mask else attn_mask
        for r0 in range(0, seqlen_q, block):
            r1 = min(seqlen_q, r0 + block)
            rows = slice(r0, r1)
            blk = {"q": at["q"][:, rows], "k": at["k"], "v": at["v"], "dout": at["dout"][:, rows]}
            if sink is not None:
                blk["sink"] = at["sink"]
            if mask is not None:
                blk["mask"] = mask[:, :, rows]
            out, _ = attention_ref(
                blk["q"].to(acc), blk["k"].to(acc), blk["v"].to(acc), var.softmax_scale, var.causal,
                var.bottom_right, var.window, var.softcap, alibi, blk.get("sink"),
                None if mask is None else blk["mask"], var.dropout_p, None if keep is None else keep[:, :, rows],
                query_rows=(r0, seqlen_q))
            first_names = [n for n in ("q", "k", "v", "sink", "mask") if n in cots and n in blk]
            firsts = torch.autograd.grad(out, [blk[n] for n in first_names], blk["dout"].to(acc),
                                         create_graph=True, allow_unused=True)
            outs, grads_out = [], []
            for n, f in zip(first_names, firsts):
                if f is None or not f.requires_grad:
                    continue  # a constant first-order gradient (e.g. no key visible): no second order
                g = cots[n]
                if n == "q":
                    g = g[:, rows]
                elif n == "mask":
                    g = g[:, :, rows]
                outs.append(f)
                grads_out.append(g.to(f.dtype))
            wrt = [n for n in needs if n in blk]
            seconds = [None] * len(wrt)
            if outs and wrt:
                seconds = torch.autograd.grad(outs, [blk[n] for n in wrt], grads_out, create_graph=create_graph,
                                              allow_unused=True)
            _accumulate(parts, wrt, seconds, blk)
    return _assemble(parts, {"q": q, "k": k, "v": v, "dout": dout, "sink": sink, "mask": attn_mask}, needs)


def _accumulate(parts, wrt, grads, blk):
    """One block's gradients (None: zero) of the inputs named wrt into parts: rows of q, dout and the mask
    per block, the others summed over the blocks."""
    for n, g in zip(wrt, grads):
        g = _zero_or(g, blk[n])
        if n in ("q", "dout", "mask"):
            parts[n].append(g)
        else:
            parts[n] = [g] if not parts[n] else [parts[n][0] + g]


def _assemble(parts, inputs, needs):
    """{name: gradient} of the inputs named needs from the blocks' parts (none: zeros of the input)."""
    result = {}
    for n in needs:
        x = inputs[n]
        if not parts[n]:
            result[n] = torch.zeros_like(x)
        elif n in ("q", "dout"):
            result[n] = torch.cat(parts[n], 1)
        elif n == "mask":
            result[n] = torch.cat(parts[n], 2)
        else:
            result[n] = parts[n][0]
    return result


def lse_vjp(q, k, alibi_slopes, sink, attn_mask, var, dlse, needs, create_graph):
    """The vector-Jacobian product of the lse that fwd returns (the logsumexp of the final scores and the
    sink, before dropout; dense layout as attention_vjp), over the same query blocks: dlse (batch, nheads,
    seqlen_q) is its cotangent, needs the names among "q", "k", "sink", "mask" whose gradients to return
    (v and dropout do not enter lse). Rows that see no key (lse -inf, or the sink) get no gradient through
    their keys. Returns {name: gradient}; differentiable when create_graph."""
    batch, seqlen_q, nheads, _ = q.shape
    seqlen_k = k.shape[1]
    acc = _lse_dtype(q.dtype)
    float_mask = attn_mask is not None and attn_mask.is_floating_point()
    block = query_block(batch, nheads, seqlen_q, seqlen_k, q.dtype, q.device.type)
    alibi = None if alibi_slopes is None else alibi_slopes.detach()
    parts = {name: [] for name in needs}
    with torch.enable_grad():
        at = {"q": _point(q, create_graph), "k": _point(k, create_graph)}
        if sink is not None:
            at["sink"] = _point(sink, create_graph)
        mask = _point(attn_mask, create_graph) if float_mask else attn_mask
        no_v = k.new_zeros(k.shape[:3] + (1,), dtype=acc)  # lse does not read v
        for r0 in range(0, seqlen_q, block):
            rows = slice(r0, min(seqlen_q, r0 + block))
            blk = {"q": at["q"][:, rows], "k": at["k"]}
            if sink is not None:
                blk["sink"] = at["sink"]
            if mask is not None:
                blk["mask"] = mask[:, :, rows]
            _, lse = attention_ref(
                blk["q"].to(acc), blk["k"].to(acc), no_v, var.softmax_scale, var.causal, var.bottom_right,
                var.window, var.softcap, alibi, blk.get("sink"), None if mask is None else blk["mask"],
                query_rows=(r0, seqlen_q))
            wrt = [n for n in needs if n in blk and (n != "mask" or float_mask)]
            grads = [None] * len(wrt)
            if wrt and lse.requires_grad:
                grads = torch.autograd.grad(lse, [blk[n] for n in wrt], dlse[:, :, rows].to(lse.dtype),
                                            create_graph=create_graph, allow_unused=True)
            _accumulate(parts, wrt, grads, blk)
    return _assemble(parts, {"q": q, "k": k, "sink": sink, "mask": attn_mask}, needs)


def dense_keep(q, rng_state, seqlen_k, dropout_p):
    """The keep mask of a fwd call (None without dropout): the dropout_mask op on its rng_state."""
    if dropout_p <= 0.0:
        return None
    return _core.dropout_mask(q=q.detach(), rng_state=rng_state, seqlen_k=seqlen_k, dropout_p=dropout_p)


def varlen_vjp(q, k, v, dout, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, alibi_slopes, sink,
               rng_state, var, cotangents, needs, create_graph):
    """attention_vjp for a variable-length batch (the varlen layout and arguments of fwd), sequence by sequence
    as the kernels read them (reference.varlen_sequences: cu_seqlens and seqused_k are read on the host).
    Rows of q and keys in no sequence get zero gradients."""
    total_q, nheads = q.shape[0], q.shape[1]
    batch = cu_seqlens_q.shape[0] - 1
    keep = None
    if var.dropout_p > 0.0:  # sequence s draws from the Philox stream of batch index s
        shape_q = q.new_empty((batch, max_seqlen_q, nheads, 1))
        keep = _core.dropout_mask(q=shape_q, rng_state=rng_state, seqlen_k=max_seqlen_k, dropout_p=var.dropout_p)
    inputs = {"q": q, "k": k, "v": v, "dout": dout, "sink": sink}
    result = {n: torch.zeros_like(inputs[n]) for n in needs}
    for s, (q0, sq, k0, sk) in enumerate(varlen_sequences(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                                                          max_seqlen_k, total_q, k.shape[0])):
        if sq == 0:
            continue
        qs, ks = slice(q0, q0 + sq), slice(k0, k0 + sk)
        slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes[s:s + 1]
        cots = {"q": None if cotangents.get("q") is None else cotangents["q"][None, qs],
                "k": None if cotangents.get("k") is None else cotangents["k"][None, ks],
                "v": None if cotangents.get("v") is None else cotangents["v"][None, ks],
                "sink": cotangents.get("sink")}
        g = attention_vjp(q[None, qs], k[None, ks], v[None, ks], dout[None, qs], slopes, sink, None,
                          None if keep is None else keep[s:s + 1, :, :sq, :sk], var, cots, needs, create_graph)
        for n in needs:
            if n in ("q", "dout"):
                result[n] = result[n].index_add(0, torch.arange(q0, q0 + sq, device=q.device), g[n][0])
            elif n in ("k", "v"):
                result[n] = result[n].index_add(0, torch.arange(k0, k0 + sk, device=k.device), g[n][0])
            else:
                result[n] = result[n] + g[n]
    return result
