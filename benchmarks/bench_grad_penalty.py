"""Gradient-penalty step benchmark: flashattn_ext's exact double backward against torch's eager attention
and SDPA's math backend (the backends of torch that have a double backward).

One step: out = attention(q, k, v); loss = sum(out * w); g = d loss / d q (create_graph=True);
(loss + ||g||^2) differentiated by q, k, v. Batch 1, 8 heads, head dim 64, non-causal; CPU fp32 (and CUDA
bf16 when a GPU is present), seqlen 1k-8k by default.

    python benchmarks/bench_grad_penalty.py --seqlens 1024 2048 4096 --out DIR

Implementations, on the same values:
- ours:      flashattn_ext.flash_attn_func on (B, S, H, D) tensors;
- eager:     matmul + softmax + matmul (bench_cpu.eager_attention) on (B, H, S, D) views;
- sdpa_math: torch.nn.functional.scaled_dot_product_attention restricted to SDPBackend.MATH (the other
             backends of torch have no double backward).
All in this process. Time: the median of runs after one warm-up (CPU: perf_counter; CUDA: events).
Peak memory: CUDA, max_memory_allocated above what existed before the step; CPU, the peak resident set
above the one before the step (VmHWM - VmRSS after resetting VmHWM through /proc/self/clear_refs; the script
re-executes itself with MALLOC_MMAP_THRESHOLD_=65536 so that freed large blocks return to the system, as
bench_cpu.py's children). Eager and sdpa_math are skipped where their (S, S) tensors would pass
SQUARE_MEMORY_LIMIT. Output: DIR/results.json and DIR/results.md.
"""
import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn_ext
from bench_cpu import MALLOC_MMAP_THRESHOLD, eager_attention, machine_info, proc_status_bytes

BATCH, HEADS, HEADDIM = 1, 8, 64
SEQLENS = (1024, 2048, 4096, 8192)
IMPLS = ("ours", "eager", "sdpa_math")
# Live (S, S) tensors of eager / math attention's double backward (measured 12-14 at S 1k-2k on the CPU).
SQUARE_TENSORS = 16
SQUARE_MEMORY_LIMIT = 16 * 2**30
TARGET_SECONDS = 20.0
MAX_RUNS = 5
SEED = 0
MIB = 2**20
DEFAULT_OUT = pathlib.Path(__file__).resolve().parent / "results" / "cpu" / "grad_penalty"


def attention(impl, q, k, v):
    if impl == "ours":
        return flashattn_ext.flash_attn_func(q, k, v)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    if impl == "eager":
        return eager_attention(qt, kt, vt, False).transpose(1, 2)
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(qt, kt, vt).transpose(1, 2)


def penalty_step(impl, q, k, v, w):
    out = attention(impl, q, k, v)
    loss = (out * w).sum()
    (gq,) = torch.autograd.grad(loss, q, create_graph=True)
    return torch.autograd.grad(loss + gq.float().square().sum(), (q, k, v))


def make_inputs(seqlen, dtype, device):
    gen = torch.Generator(device=device).manual_seed(SEED)
    shape = (BATCH, seqlen, HEADS, HEADDIM)
    q, k, v, w = (torch.randn(shape, generator=gen, dtype=dtype, device=device) for _ in range(4))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), w


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_bytes(fn, device):
    """Peak memory of fn() above the memory in use before it (see the docstring)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        result = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        del result
        return peak
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = proc_status_bytes("VmRSS")
    result = fn()
    peak = proc_status_bytes("VmHWM") - before
    del result
    return peak


def median_ms(fn, device):
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    warm = time.perf_counter() - start
    runs = max(1, min(MAX_RUNS, int(TARGET_SECONDS / max(warm, 1e-6))))
    times = []
    for _ in range(runs):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times), runs


def bench(seqlen, dtype, device):
    q, k, v, w = make_inputs(seqlen, dtype, device)
    fits = SQUARE_TENSORS * BATCH * HEADS * seqlen * seqlen * max(dtype.itemsize, 4) <= SQUARE_MEMORY_LIMIT
    results = {}
    for impl in IMPLS:
        if impl != "ours" and not fits:
            results[impl] = None
            continue
        step = lambda: penalty_step(impl, q, k, v, w)  # noqa: E731
        peak = peak_bytes(step, device)
        ms, runs = median_ms(step, device)
        results[impl] = {"ms": ms, "runs": runs, "peak_bytes": peak}
    return results


def markdown(report):
    lines = []
    for section in report["sections"]:
        lines += [f"### {section['device']} {section['dtype']}, B{BATCH} H{HEADS} D{HEADDIM}, non-causal", "",
                  "| S | " + " | ".join(f"{i} ms" for i in IMPLS) + " | " + " | ".join(f"{i} MiB" for i in IMPLS)
                  + " | ours / eager time | ours / sdpa_math time |",
                  "|---" * (2 * len(IMPLS) + 3) + "|"]
        for row in section["results"]:
            r = row["impls"]
            ms = [("-" if r[i] is None else f"{r[i]['ms']:.0f}") for i in IMPLS]
            mem = [("-" if r[i] is None else f"{r[i]['peak_bytes'] / MIB:.0f}") for i in IMPLS]
            ratios = [("-" if r[i] is None else f"{r['ours']['ms'] / r[i]['ms']:.2f}") for i in ("eager", "sdpa_math")]
            lines.append(f"| {row['seqlen']} | " + " | ".join(ms + mem + ratios) + " |")
        lines.append("")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seqlens", type=int, nargs="+", default=SEQLENS)
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    parser.add_argument("--no-cpu", action="store_true", help="CUDA only")
    args = parser.parse_args()
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != str(MALLOC_MMAP_THRESHOLD):
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(MALLOC_MMAP_THRESHOLD))
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    targets = [] if args.no_cpu else [(torch.device("cpu"), torch.float32)]
    if torch.cuda.is_available():
        targets.append((torch.device("cuda"), torch.bfloat16))
    report = {"machine": machine_info(), "sections": []}
    args.out.mkdir(parents=True, exist_ok=True)

    def write():  # after every point: a long sweep stopped midway keeps what it measured
        report["total_seconds"] = time.perf_counter() - start
        (args.out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / "results.md").write_text(markdown(report))
    if torch.cuda.is_available():
        report["machine"]["gpu"] = torch.cuda.get_device_name()
    start = time.perf_counter()
    for device, dtype in targets:
        section = {"device": device.type, "dtype": str(dtype).removeprefix("torch."), "results": []}
        report["sections"].append(section)
        for seqlen in args.seqlens:
            impls = bench(seqlen, dtype, device)
            section["results"].append({"seqlen": seqlen, "impls": impls})
            print(f"{device.type} S={seqlen}: " + "  ".join(
                f"{i} {r['ms']:.0f} ms {r['peak_bytes'] // MIB} MiB" for i, r in impls.items() if r is not None)
                + f"  [{time.perf_counter() - start:.0f} s]", flush=True)
            write()
    print(markdown(report))


if __name__ == "__main__":
    main()
