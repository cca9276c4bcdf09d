"""CPU benchmark: flashattn_ext against eager attention and torch's scaled_dot_product_attention.

fp32 (--dtype: also bf16 / fp16), batch 1, 8 heads, head dim 64, seqlen 512 ... 8192, non-causal and
causal. For each implementation: forward time, forward+backward time, and the peak extra memory of one
forward+backward.

    python benchmarks/bench_cpu.py                        # full sweep, ~5-10 min on 2 cores
    python benchmarks/bench_cpu.py --seqlens 512 1024     # a subset
    OMP_NUM_THREADS=1 python benchmarks/bench_cpu.py --dtype bfloat16 --impls ours sdpa --clock cpu \
        --no-memory --seqlens 512 1024 2048 4096 --out benchmarks/results/cpu/bf16_2026-12-03/bfloat16

Implementations, all fed the same values:
- ours:  flashattn_ext.flash_attn_func on q, k, v of shape (B, S, H, D), contiguous;
- eager: matmul + softmax + matmul written out below, on the (B, H, S, D) transposed views of the
         same tensors (no copies made by this script);
- sdpa:  torch.nn.functional.scaled_dot_product_attention on the same (B, H, S, D) views.

Time: all implementations run in this process on the same inputs (which require grad, as in
training). CPU ops are synchronous, so time.perf_counter around a call is its time. --clock cpu
measures the process's CPU time instead (time.process_time), with one thread (OMP_NUM_THREADS=1):
insensitive to other jobs on a shared machine, where wall time with two threads is not. After one
warm-up call each, the implementations run round-robin (so background load on a shared machine
hits them alike) for about TARGET_SECONDS, MIN_RUNS to MAX_RUNS rounds, and each keeps its median.
Forward+backward is the forward followed by torch.autograd.grad with a fixed dout.

Peak memory: each (implementation, seqlen, causal) point runs in a fresh child process of this
script (--child-memory), so nothing cached by earlier measurements counts. The child starts with
MALLOC_MMAP_THRESHOLD_=65536: glibc then serves every block of 64 KiB or more with its own mmap
and unmaps it when freed (a fixed threshold also switches off glibc's dynamic threshold, which
would otherwise keep freed large blocks in the heap), so the resident set follows live memory.
The child runs one small warm-up forward+backward (seqlen CHILD_WARMUP_SEQLEN: loads code, starts
threads), builds the inputs, writes "5" to /proc/self/clear_refs (which resets the kernel's
peak-RSS counter VmHWM to the current VmRSS), reads VmRSS, runs one forward+backward and reads
VmHWM. Peak extra memory = VmHWM - VmRSS: everything one forward+backward touches beyond its
inputs (out, dq, dk, dv and all intermediates, e.g. eager's (S, S) matrices), to page granularity.
Eager is skipped where its (S, S) intermediates alone would pass EAGER_MEMORY_LIMIT.

Output (--out, default benchmarks/results/cpu/): results.json (machine, settings, every number)
and results.md (tables with the ratios ours/eager and ours/sdpa; below 1 means ours is faster or
smaller).
"""
import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import flashattn_ext

BATCH, HEADS, HEADDIM = 1, 8, 64
DTYPE = torch.float32  # --dtype sets it
DTYPES = ("float32", "bfloat16", "float16")
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter  # --clock sets it
SEQLENS = (512, 1024, 2048, 4096, 8192)
IMPLS = ("ours", "eager", "sdpa")
TARGET_SECONDS = 1.0
MIN_RUNS, MAX_RUNS = 3, 10
SEED = 0
# Eager's peak holds about this many fp32 (B, H, S, S) matrices: the probabilities saved for
# backward, dP and dS (measured: 392 MiB at S=2048, 3.06 of them).
EAGER_SQUARE_MATRICES = 3
EAGER_MEMORY_LIMIT = 8 * 2**30
MALLOC_MMAP_THRESHOLD = 64 * 2**10
CHILD_WARMUP_SEQLEN = 256
MIB = 2**20
DEFAULT_OUT = pathlib.Path(__file__).resolve().parent / "results" / "cpu"


def eager_attention(q, k, v, causal):
    """softmax(q kᵀ / √D) v written out; q, k, v: (B, H, S, D) -> (B, H, S, D)."""
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B, H, S, S)
    if causal:
        seqlen = q.shape[-2]
        future = torch.ones(seqlen, seqlen, dtype=torch.bool, device=q.device).triu(1)  # (S, S)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def attention(impl, q, k, v, causal):
    """q, k, v: (B, S, H, D) -> out (B, S, H, D) (a transposed view for eager and sdpa)."""
    if impl == "ours":
        return flashattn_ext.flash_attn_func(q, k, v, causal=causal)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, S, D) views, no copy
    if impl == "eager":
        return eager_attention(qt, kt, vt, causal).transpose(1, 2)
    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)


def make_inputs(seqlen):
    """q, k, v (B, S, H, D) requiring grad, and dout (B, S, H, D); the same values on every call."""
    generator = torch.Generator().manual_seed(SEED)
    shape = (BATCH, seqlen, HEADS, HEADDIM)
    q, k, v, dout = (torch.randn(shape, generator=generator, dtype=DTYPE) for _ in range(4))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), dout


def forward_backward(impl, q, k, v, dout, causal):
    out = attention(impl, q, k, v, causal)
    return torch.autograd.grad(out, (q, k, v), dout)


def median_seconds(fns):
    """fns: name -> callable. Median wall time of each after warm-up, the calls interleaved."""
    warmup = {}
    for name, fn in fns.items():
        start = clock()
        fn()
        warmup[name] = clock() - start
    rounds = min(MAX_RUNS, max(MIN_RUNS, int(TARGET_SECONDS / sum(warmup.values()))))
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def eager_fits(seqlen):
    return EAGER_SQUARE_MATRICES * BATCH * HEADS * seqlen * seqlen * DTYPE.itemsize <= EAGER_MEMORY_LIMIT


def proc_status_bytes(field):
    """A kB field of /proc/self/status (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def child_peak_memory(impl, seqlen, causal):  # DTYPE set by the caller
    """Runs in the child process: peak extra bytes of one forward+backward (see the docstring)."""
    forward_backward(impl, *make_inputs(CHILD_WARMUP_SEQLEN), causal)
    q, k, v, dout = make_inputs(seqlen)
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    before = proc_status_bytes("VmRSS")
    grads = forward_backward(impl, q, k, v, dout, causal)
    peak = proc_status_bytes("VmHWM")
    del grads
    return peak - before


def peak_memory(impl, seqlen, causal):
    """Peak extra bytes of one forward+backward, measured in a fresh child process."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(MALLOC_MMAP_THRESHOLD))
    child = subprocess.run(
        [sys.executable, __file__, "--child-memory", impl, str(seqlen), str(int(causal)),
         "--dtype", str(DTYPE).removeprefix("torch.")],
        env=env, capture_output=True, text=True,
    )
    if child.returncode != 0:
        print(f"  memory child {impl} S={seqlen} causal={causal} failed: {child.stderr.strip()[-500:]}")
        return None
    return int(child.stdout.split()[-1])


def bench_point(seqlen, causal, run, memory):
    """The implementations in run (sdpa among them) at one (seqlen, causal): times, peak memory (if
    memory) and agreement with sdpa."""
    q, k, v, dout = make_inputs(seqlen)
    impls = [impl for impl in IMPLS if impl in run and (impl != "eager" or eager_fits(seqlen))]
    with torch.no_grad():
        outs = {impl: attention(impl, q, k, v, causal) for impl in impls}
    fwd = median_seconds({impl: lambda impl=impl: attention(impl, q, k, v, causal) for impl in impls})
    fwd_bwd = median_seconds({impl: lambda impl=impl: forward_backward(impl, q, k, v, dout, causal)
                              for impl in impls})
    results = {impl: None for impl in IMPLS}
    for impl in impls:
        results[impl] = {
            "fwd_ms": 1e3 * fwd[impl],
            "fwd_bwd_ms": 1e3 * fwd_bwd[impl],
            "peak_bytes": peak_memory(impl, seqlen, causal) if memory else None,
            "max_abs_diff_vs_sdpa": (outs[impl] - outs["sdpa"]).abs().max().item(),
        }
    return results


def machine_info():
    cpu_model = platform.processor()
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu_model": cpu_model,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "flashattn_ext_version": flashattn_ext.__version__,
        "python_version": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def ratio(ours, other, key):
    if ours is None or other is None or ours[key] is None or other[key] is None:
        return None
    return ours[key] / other[key]


def cell(value, fmt):
    return "–" if value is None else format(value, fmt)


def markdown(report):
    machine = report["machine"]
    lines = [
        "# CPU attention benchmark",
        "",
        f"{machine['cpu_model']}, {machine['cores']} cores ({machine['torch_threads']} torch threads), "
        f"torch {machine['torch_version']}, flashattn_ext {machine['flashattn_ext_version']}, {machine['date']}.",
        f"{report['settings']['dtype']}, B={BATCH}, H={HEADS}, D={HEADDIM}. Median "
        f"{'CPU times of one thread' if report['settings']['clock'] == 'cpu' else 'times'} in ms; memory is the "
        "peak extra MiB of one "
        "forward+backward. Ratios are ours ÷ other: below 1 means ours is faster or smaller. "
        "– : not run (not asked for, eager above the memory limit) or failed.",
        "",
        "| S | causal | fwd ours | fwd eager | fwd sdpa | f+b ours | f+b eager | f+b sdpa "
        "| ours/eager fwd | ours/eager f+b | ours/sdpa fwd | ours/sdpa f+b |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for point in report["results"]:
        r = point["impls"]
        get = lambda impl, key: None if r[impl] is None else r[impl][key]  # noqa: E731
        lines.append("| " + " | ".join([
            str(point["seqlen"]), "yes" if point["causal"] else "no",
            *(cell(get(impl, "fwd_ms"), ".1f") for impl in IMPLS),
            *(cell(get(impl, "fwd_bwd_ms"), ".1f") for impl in IMPLS),
            cell(ratio(r["ours"], r["eager"], "fwd_ms"), ".2f"),
            cell(ratio(r["ours"], r["eager"], "fwd_bwd_ms"), ".2f"),
            cell(ratio(r["ours"], r["sdpa"], "fwd_ms"), ".2f"),
            cell(ratio(r["ours"], r["sdpa"], "fwd_bwd_ms"), ".2f"),
        ]) + " |")
    lines += [
        "",
        "| S | causal | peak MiB ours | peak MiB eager | peak MiB sdpa | ours/eager | ours/sdpa |",
        "|---|---|---|---|---|---|---|",
    ]
    for point in report["results"]:
        r = point["impls"]
        mib = [None if r[impl] is None or r[impl]["peak_bytes"] is None else r[impl]["peak_bytes"] / MIB
               for impl in IMPLS]
        lines.append("| " + " | ".join([
            str(point["seqlen"]), "yes" if point["causal"] else "no",
            *(cell(m, ".1f") for m in mib),
            cell(ratio(r["ours"], r["eager"], "peak_bytes"), ".3f"),
            cell(ratio(r["ours"], r["sdpa"], "peak_bytes"), ".2f"),
        ]) + " |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seqlens", type=int, nargs="+", default=SEQLENS)
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="of q, k, v (default float32)")
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=IMPLS, help="those to run (sdpa always)")
    parser.add_argument("--clock", choices=CLOCKS, default="wall", help="cpu: process CPU time, one thread")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory child processes")
    parser.add_argument("--child-memory", nargs=3, metavar=("IMPL", "SEQLEN", "CAUSAL"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    global DTYPE, clock
    DTYPE = getattr(torch, args.dtype)
    clock = CLOCKS[args.clock]
    if args.clock == "cpu" and torch.get_num_threads() != 1:
        parser.error("--clock cpu needs one thread: run with OMP_NUM_THREADS=1")
    if args.child_memory:
        impl, seqlen, causal = args.child_memory
        print(child_peak_memory(impl, int(seqlen), bool(int(causal))))
        return

    report = {
        "machine": machine_info(),
        "settings": {"dtype": args.dtype, "clock": args.clock, "batch": BATCH, "nheads": HEADS, "headdim": HEADDIM,
                     "warmup_runs": 1, "min_runs": MIN_RUNS, "max_runs": MAX_RUNS,
                     "eager_memory_limit_bytes": EAGER_MEMORY_LIMIT},
        "results": [],
    }
    start = time.perf_counter()
    for seqlen in args.seqlens:
        for causal in (False, True):
            impls = bench_point(seqlen, causal, set(args.impls) | {"sdpa"}, not args.no_memory)
            report["results"].append({"seqlen": seqlen, "causal": causal, "impls": impls})
            summary = "  ".join(
                f"{impl} {r['fwd_ms']:.1f}/{r['fwd_bwd_ms']:.1f} ms "
                f"{'?' if r['peak_bytes'] is None else r['peak_bytes'] // MIB} MiB"
                for impl, r in impls.items() if r is not None
            )
            print(f"S={seqlen:5d} causal={causal!s:5}  fwd/fwd+bwd  {summary}  "
                  f"[{time.perf_counter() - start:.0f} s]", flush=True)
    report["total_seconds"] = time.perf_counter() - start

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "results.md").write_text(markdown(report))
    print(markdown(report))
    print(f"wrote {args.out / 'results.json'} and {args.out / 'results.md'}")


if __name__ == "__main__":
    main()
