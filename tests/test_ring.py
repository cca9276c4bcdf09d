"""flashattn_ext.distributed.ring_attention across processes: out, lse and dq/dk/dv of every rank's shard
equal to one flash_attn_func call on the whole sequence (float32/float64; float16/bfloat16 against the
float64 reference with the single-call tolerances), causal and not, contiguous and zigzag layouts, GQA/MQA.

CPU: gloo across 2, 3 and 4 processes (one spawn per world size runs all its cases; the 4-process spawn
also runs the ring on subgroups of 2 ranks and of 1). CUDA: NCCL across 2, 4 and 8 GPUs, each skipped
unless that many GPUs are present. Every process group has a timeout and every spawn a deadline, so a
broken ring fails instead of hanging."""
import dataclasses
import datetime
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import flashattn_ext
from fa_testing import (DTYPE_NAMES, HALF_DTYPES, OUT_TOL, assert_close, assert_lse_close, expected_lse_dtype, grad_tol,
                        reference_with_grads)
from flashattn_ext.distributed import ring_attention, shard_sequence, unshard_sequence

PG_TIMEOUT = datetime.timedelta(seconds=60)  # any collective or P2P that waits longer fails
SPAWN_DEADLINE_S = 240  # the whole spawn (startup included); then its processes are killed
JOIN_POLL_S = 1.0


@dataclasses.dataclass(frozen=True)
class Case:
    dtype: torch.dtype
    causal: bool
    layout: str
    nheads: int
    nheads_kv: int
    batch: int = 2
    local_seqlen: int = 6  # tokens per rank (zigzag: two chunks of 3)
    headdim: int = 16

    def __str__(self):
        return (f"{DTYPE_NAMES[self.dtype]} {'causal' if self.causal else 'full'} {self.layout} "
                f"h{self.nheads}/{self.nheads_kv} b{self.batch} l{self.local_seqlen} d{self.headdim}")


HEADS = ((4, 2), (2, 2), (4, 1))  # GQA, MHA, MQA in turn
LAYOUTS = ("contiguous", "zigzag")
CPU_CASES = [
    Case(dtype, causal, layout, *HEADS[i % len(HEADS)])
    for i, (dtype, causal, layout) in enumerate(
        (dt, c, lay) for dt in (torch.float64, torch.float32) for c in (False, True) for lay in LAYOUTS)
]
CUDA_CASES = [
    Case(dtype, causal, layout, 4, 2, batch=2, local_seqlen=128, headdim=64)
    for dtype in (torch.bfloat16, torch.float16, torch.float32) for causal in (False, True)
    for layout in LAYOUTS
]


def _inputs(case, world_size, device, seed):
    """Whole-sequence q, k, v, dout, the same on every rank."""
    gen = torch.Generator().manual_seed(seed)
    seqlen = case.local_seqlen * world_size

    def rnd(h):
        return torch.randn(case.batch, seqlen, h, case.headdim, generator=gen, dtype=torch.float64)

    q, k, v, dout = rnd(case.nheads), rnd(case.nheads_kv), rnd(case.nheads_kv), rnd(case.nheads)
    return tuple(t.to(device=device, dtype=case.dtype) for t in (q, k, v, dout))


def _reference(case, q, k, v, dout):
    """(out, lse, dq, dk, dv) of the whole sequence: one flash_attn_func call for float32/float64, the
    float64 reference for half dtypes (the suite's single-call tolerances then apply)."""
    if case.dtype in HALF_DTYPES:
        return reference_with_grads(q, k, v, dout, causal=case.causal)
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, lse = flashattn_ext.flash_attn_func(q, k, v, causal=case.causal, return_lse=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    return out, lse, dq, dk, dv


def _check_case(case, group, seed):
    """Runs the ring on group for case; returns a failure message or None (the ring's collectives run
    on every rank of group whatever the comparisons find)."""
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
    q, k, v, dout = _inputs(case, world_size, device, seed)

    def mine(t, dim=1):
        return shard_sequence(t, world_size, rank, case.layout, dim=dim)

    ql, kl, vl = (mine(t).detach().clone().requires_grad_() for t in (q, k, v))
    out, lse = ring_attention(ql, kl, vl, group=group, causal=case.causal, layout=case.layout, return_lse=True)
    dq, dk, dv = torch.autograd.grad(out, (ql, kl, vl), mine(dout))
    ref_out, ref_lse, ref_dq, ref_dk, ref_dv = _reference(case, q, k, v, dout)
    tol = OUT_TOL[case.dtype]
    try:
        assert out.dtype == case.dtype and lse.dtype == expected_lse_dtype(case.dtype)
        assert_close("out", out, mine(ref_out), tol)
        assert_lse_close(lse, mine(ref_lse, dim=2), tol)
        for name, got, ref in (("dq", dq, ref_dq), ("dk", dk, ref_dk), ("dv", dv, ref_dv)):
            assert_close(name, got, mine(ref), grad_tol(case.dtype))
    except AssertionError as e:
        return f"rank {rank}/{world_size} {case}: {e}"
    return None


def _worker(rank, world_size, port, backend, cases, subgroups):
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=PG_TIMEOUT)
    try:
        failures = [_check_case(case, None, seed) for seed, case in enumerate(cases)]
        for ranks_per_group in subgroups:
            # Every rank creates every subgroup (new_group's contract), then runs the ring on its own:
            # rank r is in the group of the ranks congruent to r modulo (world_size / ranks_per_group).
            stride = world_size // ranks_per_group
            groups = [dist.new_group(list(range(first, world_size, stride))) for first in range(stride)]
            mine = groups[rank % stride]
            failures += [_check_case(case, mine, 100 + seed + rank % stride) for seed, case in enumerate(cases)]
        failures = [f for f in failures if f is not None]
        if failures:
            raise AssertionError("\n".join(failures))
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(world_size, backend, cases, subgroups=()):
    ctx = mp.start_processes(_worker, args=(world_size, _free_port(), backend, cases, subgroups), nprocs=world_size,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + SPAWN_DEADLINE_S
    while not ctx.join(timeout=JOIN_POLL_S):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"ring_attention over {world_size} {backend} processes did not finish in {SPAWN_DEADLINE_S} s")


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_gloo(world_size):
    _spawn(world_size, "gloo", CPU_CASES, subgroups=(2, 1) if world_size == 4 else ())


@pytest.mark.cuda
@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_ring_nccl(world_size):
    if not torch.cuda.is_available() or torch.cuda.device_count() < world_size:
        pytest.skip(f"needs {world_size} CUDA devices")
    if not dist.is_nccl_available():
        pytest.skip("torch was built without NCCL")
    _spawn(world_size, "nccl", CUDA_CASES)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_shard_roundtrip(layout, world_size):
    x = torch.arange(2 * 12 * world_size).view(2, 12 * world_size)
    shards = [shard_sequence(x, world_size, r, layout) for r in range(world_size)]
    assert torch.equal(unshard_sequence(shards, layout), x)
    if layout == "zigzag":
        n, c = world_size, 6
        assert torch.equal(shards[0][0], torch.cat([x[0, :c], x[0, (2 * n - 1) * c:]]))


def test_zigzag_causal_work_is_balanced():
    """Under a causal mask with the zigzag layout every rank attends to the same number of
    (query, key) pairs: the point of the layout."""
    world_size, seqlen = 4, 8
    visible = torch.ones(world_size * seqlen, world_size * seqlen).tril().bool()
    idx = torch.arange(world_size * seqlen)
    pairs = [int(visible[shard_sequence(idx, world_size, r, "zigzag", dim=0)].sum()) for r in range(world_size)]
    assert len(set(pairs)) == 1


def test_bad_arguments():
    q = torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match="layout"):
        ring_attention(q, q, q, layout="striped")
    with pytest.raises(ValueError, match="even"):
        ring_attention(q[:, :3], q[:, :3], q[:, :3], layout="zigzag")
    with pytest.raises(ValueError, match="multiple"):
        ring_attention(torch.zeros(1, 4, 3, 8), q, q)
    with pytest.raises(ValueError, match="local_seqlen"):
        ring_attention(q, q[:, :2], q[:, :2])
    with pytest.raises(ValueError, match="4 dimensions"):
        ring_attention(q[0], q, q)
    with pytest.raises(ValueError, match="multiple of 8"):
        shard_sequence(torch.zeros(1, 12), 4, 0, "zigzag")
