"""Ring attention (context parallelism) over torch.distributed: exact attention over one sequence whose
tokens are split across the ranks of a process group.

    shard = flashattn_ext.distributed.shard_sequence(x, world_size, rank, layout="zigzag")   # (B, L, H, D)
    out = flashattn_ext.distributed.ring_attention(q, k, v, causal=True, layout="zigzag")

Layouts (N ranks, global sequence length N * L):
- "contiguous": rank r holds tokens [r L, (r + 1) L).
- "zigzag": the sequence is cut into 2N chunks of L / 2 tokens; rank r holds chunks r and 2N - 1 - r, in
  that order. Under a causal mask every rank then does the same work at every step (load balance).

Forward: the rank's K/V shard travels once around the ring (rank r sends to r + 1 and receives from
r - 1 with batch_isend_irecv), the transfer of the next shard overlapping the attention of the local
queries against the current one. Each step gives a partial (out, lse) over a disjoint key set; they are
merged exactly in float32 (float64 for float64 inputs): lse = log(exp(lse_acc) + exp(lse_s)),
out = out_acc exp(lse_acc - lse) + out_s exp(lse_s - lse), the in-place form of merge_attention_states.
Which key shard a query shard sees under a causal mask (q at chunk a, kv at chunk b: b < a full,
b = a causal, b > a nothing):
- contiguous, kv from rank s: s = r causal (the diagonal), s < r full, s > r skipped.
- zigzag, kv from rank s: s = r the whole local block causal (chunks (r, 2N-1-r) against themselves);
  s < r all local queries against the first kv chunk s, full; s > r the second query chunk 2N-1-r
  against both kv chunks, full.
Backward: the ring runs again. Each step recomputes the block's gradients with flashattn_ext's backward
kernel given the final merged out and lse, which makes the blockwise gradients exact
(P = exp(S - lse_final), delta = rowsum(dO * O_final)); dQ accumulates locally, and a float32 dK/dV
accumulator travels with the K/V shard it belongs to, each rank adding its block's part, until one
more hop brings it home to the shard's owner.

All ranks must pass tensors of the same shape (the same local sequence length) on their own device
(CUDA with NCCL, CPU with gloo)."""
import torch
import torch.distributed as dist

from . import _core
from ._checks import _check_bools, _check_scale, _default_scale

LAYOUTS = ("contiguous", "zigzag")
# batch_isend_irecv tags: the K/V ring and the dK/dV ring of the backward can be in flight together.
_TAG_KV, _TAG_DKV = 0, 1


def _check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"ring_attention: layout must be one of {LAYOUTS}, got {layout!r}")


def _chunks(world_size, rank, layout):
    """The (chunk index, number of chunks) pairs that rank holds, in order."""
    if layout == "contiguous":
        return ((rank, world_size),)
    return ((rank, 2 * world_size), (2 * world_size - 1 - rank, 2 * world_size))


def shard_sequence(x, world_size, rank, layout="contiguous", dim=1):
    """Rank's shard of the whole sequence x along dim (a view for contiguous, a copy for zigzag). The
    length along dim must be a multiple of world_size (of 2 * world_size for zigzag)."""
    _check_layout(layout)
    if not 0 <= rank < world_size:
        raise ValueError(f"shard_sequence: rank must be in [0, {world_size}), got {rank}")
    pieces = []
    for index, count in _chunks(world_size, rank, layout):
        if x.shape[dim] % count:
            raise ValueError(f"shard_sequence: length {x.shape[dim]} along dim {dim} is not a multiple of {count} "
                             f"({layout} layout over {world_size} ranks)")
        size = x.shape[dim] // count
        pieces.append(x.narrow(dim, index * size, size))
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim)


def unshard_sequence(shards, layout="contiguous", dim=1):
    """The whole sequence from the list of every rank's shard (rank order): the inverse of shard_sequence."""
    _check_layout(layout)
    if layout == "contiguous":
        return torch.cat(list(shards), dim)
    world_size = len(shards)
    halves = [s.chunk(2, dim) for s in shards]
    ordered = [halves[r][0] for r in range(world_size)] + [halves[r][1] for r in reversed(range(world_size))]
    return torch.cat(ordered, dim)


def _block(layout, causal, rank, src, seqlen):
    """(query rows, key rows, causal) of the local queries against the kv shard of rank src, or None
    when no query sees a key of it."""
    whole = slice(0, seqlen)
    if not causal:
        return whole, whole, False
    if src == rank:
        return whole, whole, True
    half = seqlen // 2
    if layout == "contiguous":
        return (whole, whole, False) if src < rank else None
    return (whole, slice(0, half), False) if src < rank else (slice(half, seqlen), whole, False)


class _Ring:
    """The ring neighbours of this rank in group (global ranks, as P2POp wants them)."""

    def __init__(self, group):
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.size = dist.get_world_size(self.group)
        self.send_to = dist.get_global_rank(self.group, (self.rank + 1) % self.size)
        self.recv_from = dist.get_global_rank(self.group, (self.rank - 1) % self.size)

    def exchange(self, send, recv, tag):
        """Starts sending send to the next rank and receiving the previous rank's into recv."""
        ops = [dist.P2POp(dist.isend, send, self.send_to, self.group, tag),
               dist.P2POp(dist.irecv, recv, self.recv_from, self.group, tag)]
        return dist.batch_isend_irecv(ops)


def _wait(works):
    for w in works:
        w.wait()


def _merge_(out_acc, lse_acc, out, lse):
    """(out_acc, lse_acc) <- their exact merge with (out, lse), in place; rows that saw no key on
    both sides stay out = 0, lse = -inf."""
    new = torch.logaddexp(lse_acc, lse)
    ref = new.masked_fill(torch.isneginf(new), 0.0)
    w_acc = torch.exp(lse_acc - ref).transpose(1, 2).unsqueeze(-1)  # (batch, seqlen, nheads, 1)
    w_new = torch.exp(lse - ref).transpose(1, 2).unsqueeze(-1)
    out_acc.mul_(w_acc).addcmul_(out, w_new)
    lse_acc.copy_(new)


def _fwd_op(q, k, v, scale, causal, deterministic):
    out, lse, _ = _core.fwd(q=q, k=k, v=v, softmax_scale=scale, causal=causal, deterministic=deterministic)
    return out, lse


def _bwd_op(dout, q, k, v, out, lse, rng_state, scale, causal, deterministic):
    dq, dk, dv, _, _ = _core.bwd(dout=dout, q=q, k=k, v=v, out=out, lse=lse, rng_state=rng_state, softmax_scale=scale,
                              causal=causal, deterministic=deterministic)
    return dq, dk, dv


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring, causal, scale, layout, deterministic):
        seqlen = q.shape[1]
        kv = torch.stack((k, v))  # (2, batch, seqlen, nheads_kv, headdim): one send buffer per step
        kv_next = torch.empty_like(kv)
        out_acc = lse_acc = None
        for step in range(ring.size):
            src = (ring.rank - step) % ring.size
            works = ring.exchange(kv, kv_next, _TAG_KV) if step < ring.size - 1 else []
            block = _block(layout, causal, ring.rank, src, seqlen)
            if block is not None:
                rows, cols, block_causal = block
                out, lse = _fwd_op(q[:, rows], kv[0][:, cols], kv[1][:, cols], scale, block_causal, deterministic)
                if out_acc is None:  # step 0: the diagonal block, every query row
                    out_acc, lse_acc = out.to(lse.dtype), lse
                else:
                    _merge_(out_acc[:, rows], lse_acc[:, :, rows], out, lse)
            _wait(works)
            kv, kv_next = kv_next, kv
        out = out_acc.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse_acc)
        ctx.args = (ring, causal, scale, layout, deterministic)
        ctx.mark_non_differentiable(lse_acc)
        return out, lse_acc

    @staticmethod
    @torch.autograd.function.once_differentiable  # bwd's autograd needs the out / lse of its own k, v: not these
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        ring, causal, scale, layout, deterministic = ctx.args
        seqlen = q.shape[1]
        acc = lse.dtype
        rng_state = torch.zeros(2, dtype=torch.int64)  # no dropout: unused by the kernel
        kv = torch.stack((k, v))
        kv_next = torch.empty_like(kv)
        dkv = torch.zeros(kv.shape, dtype=acc, device=kv.device)  # the accumulator of the kv shard held now
        dkv_next = torch.empty_like(dkv)
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        dkv_works = []
        for step in range(ring.size):
            src = (ring.rank - step) % ring.size
            kv_works = ring.exchange(kv, kv_next, _TAG_KV) if step < ring.size - 1 else []
            block = _block(layout, causal, ring.rank, src, seqlen)
            if block is not None:
                rows, cols, block_causal = block
                dq_b, dk_b, dv_b = _bwd_op(dout[:, rows], q[:, rows], kv[0][:, cols], kv[1][:, cols], out[:, rows],
                                           lse[:, :, rows], rng_state, scale, block_causal, deterministic)
                dq[:, rows] += dq_b
            _wait(dkv_works)  # dkv: what the ranks before this one added for shard src
            if block is not None:
                dkv[0][:, cols] += dk_b
                dkv[1][:, cols] += dv_b
            dkv_works = ring.exchange(dkv, dkv_next, _TAG_DKV)
            dkv, dkv_next = dkv_next, dkv
            _wait(kv_works)
            kv, kv_next = kv_next, kv
        _wait(dkv_works)  # the last hop: this rank's own shard's accumulator, complete
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None, None


def _check_inputs(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"ring_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"ring_attention: {name} must have 4 dimensions (batch, local_seqlen, nheads, "
                             f"headdim), got {t.dim()}")
    if k.shape != v.shape:
        raise ValueError(f"ring_attention: k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    if k.shape[0] != q.shape[0] or k.shape[1] != q.shape[1] or k.shape[3] != q.shape[3]:
        raise ValueError(f"ring_attention: k and v {tuple(k.shape)} must match q {tuple(q.shape)} in batch, "
                         f"local_seqlen and headdim (shards of one sequence)")
    if k.shape[2] == 0 or q.shape[2] % k.shape[2]:
        raise ValueError(f"ring_attention: nheads of q ({q.shape[2]}) must be a multiple of nheads of k and v "
                         f"({k.shape[2]})")


def ring_attention(q, k, v, group=None, causal=False, softmax_scale=None, layout="contiguous", deterministic=False,
                   return_lse=False):
    """Exact attention of this rank's queries over the whole sequence, which the ranks of group
    (default: the world) hold in shards.

    q: (batch, local_seqlen, nheads, headdim), k, v: (batch, local_seqlen, nheads_kv, headdim), nheads a
    multiple of nheads_kv (GQA/MQA); this rank's shard of the sequence in the given layout
    ("contiguous" or "zigzag", see shard_sequence; zigzag needs an even local_seqlen). The same shapes on
    every rank. causal: query i of the whole sequence sees keys j <= i. softmax_scale: default
    1/sqrt(headdim). deterministic: a reproducible backward on CUDA. With more than one rank the backward
    is once differentiable: differentiating it again (create_graph) raises.
    Returns out (batch, local_seqlen, nheads, headdim), this rank's rows of attention over the whole
    sequence, differentiable in q, k and v; with return_lse also lse (batch, nheads, local_seqlen),
    float32 (float64 for float64 inputs)."""
    _check_bools("ring_attention", causal=causal, deterministic=deterministic, return_lse=return_lse)
    _check_layout(layout)
    _check_inputs(q, k, v)
    if layout == "zigzag" and q.shape[1] % 2:
        raise ValueError(f"ring_attention: the zigzag layout needs an even local_seqlen, got {q.shape[1]}")
    if softmax_scale is None:
        scale = _default_scale(q.shape[-1])
    else:
        scale = _check_scale("ring_attention", "softmax_scale", softmax_scale)
    ring = _Ring(group)
    if ring.size == 1:
        out, lse, _ = _core.fwd(q=q, k=k, v=v, softmax_scale=scale, causal=bool(causal),
                                deterministic=bool(deterministic))
    else:
        out, lse = _RingAttention.apply(q, k, v, ring, bool(causal), scale, layout, bool(deterministic))
    return (out, lse) if return_lse else out
