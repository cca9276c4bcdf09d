"""Weak scaling of flashattn_ext.distributed.ring_attention: the sequence length per GPU fixed (32k tokens),
bf16, head dim 128, nheads = 2048 // headdim, batch 1, causal (zigzag layout) and not, over NCCL.

Run under torchrun, once per GPU count; each run adds its JSON to --out and rewrites the summary table:

    torchrun --standalone --nproc_per_node=1 benchmarks/bench_ring.py --out benchmarks/results/h200_ring
    torchrun --standalone --nproc_per_node=2 benchmarks/bench_ring.py --out benchmarks/results/h200_ring
    torchrun --standalone --nproc_per_node=8 benchmarks/bench_ring.py --out benchmarks/results/h200_ring
    torchrun --standalone --nproc_per_node=2 benchmarks/bench_ring.py --dry-run --out /tmp/ring   # CPU, gloo

What each run measures, on every rank at once:
- single: flash_attn_func on the rank's own shard alone (q, k, v of seq_per_gpu tokens, no communication),
  the one-GPU kernel at the same shape; its TFLOP/s (averaged over the ranks) is the baseline.
- ring: ring_attention over all N ranks on N * seq_per_gpu tokens. A timed call is a barrier followed
  by the call; its time is the slowest rank's (all_reduce MAX). TFLOP/s per GPU = the whole sequence's
  FLOPs / time / N, with fwd = 4·B·H·S²·D (halved when causal) and bwd = 2.5 × fwd as bench_gpu.py.
- efficiency = ring TFLOP/s per GPU / single TFLOP/s (target >= 0.9), forward and backward.
- comm: the time of one full circulation of a K/V shard (N - 1 exchanges, nothing else), for comparison
  with the ring's compute time (the exchanges overlap the compute inside ring_attention).
Backward: torch.autograd.grad on a retained graph. Times: medians over CUDA events (perf_counter on the CPU).
NCCL settings are the machine's: this script reads the NCCL_* environment into the JSON and sets nothing.

Output in --out: ring_n{N}.json (device, versions, NCCL_* environment, every time) and results.md (one
table over all ring_n*.json present)."""
import argparse
import datetime
import json
import os
import pathlib
import statistics
import time

import torch
import torch.distributed as dist

import flashattn_ext
from flashattn_ext.distributed import ring_attention, shard_sequence

FULL = {"device": "cuda", "backend": "nccl", "dtype": torch.bfloat16, "seq_per_gpu": 32768, "hidden": 2048,
        "headdim": 128, "batch": 1, "warmup": 3, "runs": 10}
DRY = {"device": "cpu", "backend": "gloo", "dtype": torch.float32, "seq_per_gpu": 256, "hidden": 128,
       "headdim": 32, "batch": 1, "warmup": 1, "runs": 2}
CONFIGS = ((False, "contiguous"), (True, "zigzag"))  # (causal, layout); non-causal work is layout-independent
BWD_FLOPS_PER_FWD = 2.5
PG_TIMEOUT = datetime.timedelta(minutes=10)
SEED = 0


def fwd_flops(batch, nheads, seqlen, headdim, causal):
    flops = 4 * batch * nheads * seqlen * seqlen * headdim
    return flops / 2 if causal else flops


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed_ms(fn, device, warmup, runs, everyone):
    """Median over runs of the time of fn() in ms; everyone=True: each run starts after a barrier and
    counts as the slowest rank's time."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(runs):
        if everyone:
            dist.barrier()
            synchronize(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            fn()
            ms = 1e3 * (time.perf_counter() - t0)
        if everyone:
            t = torch.tensor([ms], dtype=torch.float64, device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            ms = t.item()
        times.append(ms)
    return statistics.median(times)


def mean_over_ranks(x, device):
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def whole_sequence(cfg, nheads, world_size, device):
    """q, k, v, dout of the whole sequence (B, N * seq_per_gpu, H, D), the same on every rank (seeded)."""
    gen = torch.Generator(device=device).manual_seed(SEED)
    shape = (cfg["batch"], world_size * cfg["seq_per_gpu"], nheads, cfg["headdim"])
    return [torch.randn(shape, generator=gen, dtype=cfg["dtype"], device=device) for _ in range(4)]


def measure(cfg, causal, layout, rank, world_size, device):
    nheads = cfg["hidden"] // cfg["headdim"]
    q, k, v, dout = (shard_sequence(t, world_size, rank, layout).contiguous()
                     for t in whole_sequence(cfg, nheads, world_size, device))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    warmup, runs = cfg["warmup"], cfg["runs"]
    result = {"causal": causal, "layout": layout, "nheads": nheads}

    single_out = flashattn_ext.flash_attn_func(q, k, v, causal=causal)
    single = {
        "fwd": timed_ms(lambda: flashattn_ext.flash_attn_func(q, k, v, causal=causal), device, warmup, runs, False),
        "bwd": timed_ms(lambda: torch.autograd.grad(single_out, (q, k, v), dout, retain_graph=True), device, warmup,
                        runs, False),
    }
    del single_out
    ring_out = ring_attention(q, k, v, causal=causal, layout=layout)
    ring = {
        "fwd": timed_ms(lambda: ring_attention(q, k, v, causal=causal, layout=layout), device, warmup, runs, True),
        "bwd": timed_ms(lambda: torch.autograd.grad(ring_out, (q, k, v), dout, retain_graph=True), device, warmup,
                        runs, True),
    }
    del ring_out
    kv = torch.stack((k.detach(), v.detach()))
    kv_next = torch.empty_like(kv)

    def circulate():
        nonlocal kv, kv_next
        for _ in range(world_size - 1):
            ops = [dist.P2POp(dist.isend, kv, (rank + 1) % world_size),
                   dist.P2POp(dist.irecv, kv_next, (rank - 1) % world_size)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            kv, kv_next = kv_next, kv

    comm_ms = timed_ms(circulate, device, warmup, runs, True) if world_size > 1 else 0.0

    local_flops = fwd_flops(cfg["batch"], nheads, cfg["seq_per_gpu"], cfg["headdim"], causal)
    total_flops = fwd_flops(cfg["batch"], nheads, world_size * cfg["seq_per_gpu"], cfg["headdim"], causal)
    factor = {"fwd": 1.0, "bwd": BWD_FLOPS_PER_FWD}
    result["single_ms_rank"] = single
    result["single_tflops"] = {p: mean_over_ranks(factor[p] * local_flops / (single[p] * 1e-3) / 1e12, device)
                               for p in single}
    result["ring_ms"] = ring
    result["ring_tflops_per_gpu"] = {p: factor[p] * total_flops / (ring[p] * 1e-3) / 1e12 / world_size for p in ring}
    result["efficiency"] = {p: result["ring_tflops_per_gpu"][p] / result["single_tflops"][p] for p in ring}
    result["comm_circulation_ms"] = comm_ms
    return result


def write_summary(out_dir):
    rows = []
    for path in sorted(out_dir.glob("ring_n*.json"), key=lambda p: int(p.stem[len("ring_n"):])):
        report = json.loads(path.read_text())
        for r in report["results"]:
            rows.append((report["world_size"], r))
    lines = [
        "# Ring attention weak scaling (benchmarks/bench_ring.py)", "",
        "Per GPU: the 1-GPU kernel on the rank's shard (single) and the ring on N x the tokens (ring), TFLOP/s",
        "per GPU; efficiency = ring / single (target >= 0.90). comm: one full K/V circulation alone (overlapped",
        "in the ring).",
        "",
        "| GPUs | causal | layout | fwd ring | fwd single | fwd eff. | bwd ring | bwd single | bwd eff. | "
        "ring fwd ms | comm ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, r in rows:
        t, s, e = r["ring_tflops_per_gpu"], r["single_tflops"], r["efficiency"]
        lines.append(f"| {n} | {r['causal']} | {r['layout']} | {t['fwd']:.4g} | {s['fwd']:.4g} | {e['fwd']:.3f} | "
                     f"{t['bwd']:.4g} | {s['bwd']:.4g} | {e['bwd']:.3f} | {r['ring_ms']['fwd']:.2f} | "
                     f"{r['comm_circulation_ms']:.2f} |")
    (out_dir / "results.md").write_text("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU over gloo")
    parser.add_argument("--seq-per-gpu", type=int, help="tokens per GPU (default 32768)")
    parser.add_argument("--causal-layouts", nargs="+", choices=("zigzag", "contiguous"),
                        help="layouts measured with causal (default zigzag)")
    args = parser.parse_args()
    cfg = dict(DRY if args.dry_run else FULL)
    if args.seq_per_gpu:
        cfg["seq_per_gpu"] = args.seq_per_gpu
    configs = [c for c in CONFIGS if not c[0]] + [(True, lay) for lay in (args.causal_layouts or ("zigzag",))]

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cfg["device"] == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(cfg["backend"], timeout=PG_TIMEOUT)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    try:
        results = []
        for causal, layout in configs:
            r = measure(cfg, causal, layout, rank, world_size, device)
            results.append(r)
            if rank == 0:
                print(f"N={world_size} causal={causal} {layout}: fwd {r['ring_tflops_per_gpu']['fwd']:.4g} TFLOP/s/GPU "
                      f"(single {r['single_tflops']['fwd']:.4g}, eff {r['efficiency']['fwd']:.3f}), bwd "
                      f"{r['ring_tflops_per_gpu']['bwd']:.4g} (single {r['single_tflops']['bwd']:.4g}, eff "
                      f"{r['efficiency']['bwd']:.3f}), comm {r['comm_circulation_ms']:.2f} ms", flush=True)
        if rank == 0:
            args.out.mkdir(parents=True, exist_ok=True)
            report = {
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "world_size": world_size,
                "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "torch": torch.__version__,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())) if device.type == "cuda" else None,
                "nccl_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")},
                "config": {k: str(v) if isinstance(v, torch.dtype) else v for k, v in cfg.items()},
                "results": results,
            }
            (args.out / f"ring_n{world_size}.json").write_text(json.dumps(report, indent=1) + "\n")
            write_summary(args.out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
