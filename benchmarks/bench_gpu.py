"""GPU benchmark: flashattn_ext beside torch's SDPA backends (flash, cuDNN, memory-efficient).

Three parts, all in one process:
1. Sweep: bf16, 16k tokens per call (batch = 16384 // seqlen), nheads = 2048 // headdim, head dim
   64/128/256, seqlen 512 ... 16384, causal and not. Forward, backward and forward+backward
   median times and TFLOP/s (fwd = 4·B·H·S²·D, halved when causal; bwd = 2.5 × fwd; fwd+bwd =
   3.5 × fwd) for ours and each SDPA backend, on the same inputs: ours gets q, k, v as
   (B, S, H, D) tensors and torch their (B, H, S, D) transposed views (same storage, same memory
   traffic). Each backend runs under torch.nn.attention.sdpa_kernel; a configuration a backend
   does not support, or a pass ours does not implement yet, is recorded as null. `ours_det` is ours
   with deterministic=True, backward passes only (the forward is the same kernel); its column
   ours/ours_det is the default mode's speed over deterministic mode's.
2. Memory: the peak extra memory (torch.cuda.max_memory_allocated minus what was allocated
   before, i.e. minus the inputs) of one inference forward (no_grad) and of one forward+backward
   at B1 H32 S8192 D128 bf16, non-causal, for ours, flash, cuDNN and eager attention
   (matmul + softmax + matmul, bench_cpu.eager_attention).
3. Training: ms/step of the examples/train_lm.py model (same seed, same batch) with
   --attn flashattn_ext and with --attn sdpa (its default backend choice, and held to the flash and to the
   cuDNN backend), and the loss each reaches.

Timing: triton.testing.do_bench(return_mode="median") when triton is installed, else a median
over CUDA events; forward+backward times the forward and torch.autograd.grad with a fixed dout,
backward times torch.autograd.grad alone on a retained graph.

    python benchmarks/bench_gpu.py --out benchmarks/results/h200/sweep_DATE   # full run, a few minutes
    python benchmarks/bench_gpu.py --quick --time-budget 120         # d64/128/256 at s2k, s8k
    python benchmarks/bench_gpu.py --dry-run --out /tmp/dry          # tiny, on the CPU, ours vs eager

The attention variants (sliding window, softcap, ALiBi, attn_mask, dropout, block-sparse) beside
FlexAttention and SDPA are measured by bench_variants.py (dev/device.sh bench variants).

Output in --out: results.json (device, versions, every time), results.md (TFLOP/s tables with
ratios ours ÷ backend, above 1 = ours faster), tflops.png (plot_results.py, needs matplotlib: TFLOP/s
vs seqlen, one panel per head dim, pass and mask, one line per implementation; `python
benchmarks/plot_results.py DIR` redraws it from DIR/results.json).
"""
import argparse
import contextlib
import datetime
import json
import pathlib
import statistics
import sys
import time
import warnings

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

import flashattn_ext
from bench_cpu import eager_attention
from plot_results import plot

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
import train_lm  # noqa: E402

try:
    from triton.testing import do_bench
except ImportError:
    do_bench = None

SDPA_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}
FULL_SWEEP = {
    "device": "cuda", "dtype": torch.bfloat16, "total_tokens": 16384, "hidden": 2048,
    "headdims": (64, 128, 256), "seqlens": (512, 1024, 2048, 4096, 8192, 16384),
    "impls": ("ours", "ours_det", "flash", "cudnn", "efficient"),
}
FWD_SAME_AS_OURS = ("ours_det",)  # implementations whose forward is ours: timed in the backward passes only
QUICK_SEQLENS = (2048, 8192)
DRY_SWEEP = {
    "device": "cpu", "dtype": torch.float32, "total_tokens": 1024, "hidden": 256,
    "headdims": (64,), "seqlens": (128, 256), "impls": ("ours", "ours_det", "eager"),
}
MEMORY_SHAPE = {"batch": 1, "nheads": 32, "seqlen": 8192, "headdim": 128}
MEMORY_IMPLS = ("ours", "flash", "cudnn", "eager")
# Training benchmark: 16k tokens per step, head dim 128 (dry run: train_lm's CPU defaults).
TRAIN_CONFIG = {"batch": 8, "seq": 2048, "layers": 8, "dmodel": 1024, "heads": 8}
TRAIN_WARMUP_STEPS, TRAIN_STEPS = 5, 30
DRY_TRAIN_WARMUP_STEPS, DRY_TRAIN_STEPS = 1, 3
# the training step with ours, with plain SDPA (its default backend choice: cuDNN on the H200) and with SDPA
# held to its flash and cuDNN backends
TRAIN_ATTN = {"flashattn_ext": ("flashattn_ext", None), "sdpa_default": ("sdpa", None),
              "sdpa_flash": ("sdpa", SDPBackend.FLASH_ATTENTION), "sdpa_cudnn": ("sdpa", SDPBackend.CUDNN_ATTENTION)}
PASSES = ("fwd", "bwd", "fwd_bwd")
FLOPS_PER_FWD = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}
DO_BENCH_WARMUP_MS, DO_BENCH_REP_MS = 25, 100
EVENT_WARMUP_RUNS, EVENT_RUNS = 5, 20
CPU_WARMUP_RUNS, CPU_RUNS = 1, 3
SEED = 0
GIB = 2**30


def backend_context(impl):
    """sdpa_kernel restricting torch to one backend, or nothing for ours and eager."""
    return sdpa_kernel(SDPA_BACKENDS[impl]) if impl in SDPA_BACKENDS else contextlib.nullcontext()


def attention(impl, q, k, v, causal):
    """q, k, v: (B, S, H, D) -> out (B, S, H, D); torch's backends and eager see (B, H, S, D) views."""
    if impl in ("ours", "ours_det"):
        return flashattn_ext.flash_attn_func(q, k, v, causal=causal, deterministic=impl == "ours_det")
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, S, D), same storage
    if impl == "eager":
        return eager_attention(qt, kt, vt, causal).transpose(1, 2)
    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)


def make_inputs(batch, seqlen, nheads, headdim, dtype, device):
    """q, k, v (B, S, H, D) requiring grad and dout (B, S, H, D), seeded."""
    generator = torch.Generator(device=device).manual_seed(SEED)
    shape = (batch, seqlen, nheads, headdim)
    q, k, v, dout = (torch.randn(shape, generator=generator, dtype=dtype, device=device) for _ in range(4))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), dout


def median_ms(fn, device):
    """Median time of fn() in ms: do_bench, CUDA events, or perf_counter on the CPU."""
    if device.type == "cpu":
        for _ in range(CPU_WARMUP_RUNS):
            fn()
        times = []
        for _ in range(CPU_RUNS):
            start = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - start))
        return statistics.median(times)
    if do_bench is not None:
        return do_bench(fn, warmup=DO_BENCH_WARMUP_MS, rep=DO_BENCH_REP_MS, return_mode="median")
    for _ in range(EVENT_WARMUP_RUNS):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(EVENT_RUNS)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def fwd_flops(batch, nheads, seqlen, headdim, causal):
    flops = 4 * batch * nheads * seqlen * seqlen * headdim
    return flops / 2 if causal else flops


def time_impl(impl, q, k, v, dout, causal, passes, device):
    """{pass: ms or None} for one implementation; errors (unsupported, not implemented) give None."""
    times = {name: None for name in PASSES}
    errors = {}
    with backend_context(impl), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch explains at length why a backend declines
        try:
            out = attention(impl, q, k, v, causal)
            if "fwd" in passes:
                times["fwd"] = median_ms(lambda: attention(impl, q, k, v, causal), device)
        except (RuntimeError, NotImplementedError) as error:
            return times, {"fwd": str(error).splitlines()[0]}
        for name, fn in (
            ("bwd", lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)),
            ("fwd_bwd", lambda: torch.autograd.grad(attention(impl, q, k, v, causal), (q, k, v), dout)),
        ):
            if name not in passes:
                continue
            try:
                times[name] = median_ms(fn, device)
            except (RuntimeError, NotImplementedError) as error:
                errors[name] = str(error).splitlines()[0]
    return times, errors


def run_sweep(sweep, passes, deadline):
    """Returns (points, truncated); each point has ms and TFLOP/s per implementation and pass."""
    device = torch.device(sweep["device"])
    points = []
    for headdim in sweep["headdims"]:
        nheads = sweep["hidden"] // headdim
        for seqlen in sweep["seqlens"]:
            batch = sweep["total_tokens"] // seqlen
            q, k, v, dout = make_inputs(batch, seqlen, nheads, headdim, sweep["dtype"], device)
            for causal in (False, True):
                if time.monotonic() > deadline:
                    return points, True
                point = {"batch": batch, "nheads": nheads, "seqlen": seqlen, "headdim": headdim,
                         "causal": causal, "ms": {}, "tflops": {}, "errors": {}}
                flops = fwd_flops(batch, nheads, seqlen, headdim, causal)
                for impl in sweep["impls"]:
                    impl_passes = [name for name in passes if name != "fwd" or impl not in FWD_SAME_AS_OURS]
                    times, errors = time_impl(impl, q, k, v, dout, causal, impl_passes, device)
                    point["ms"][impl] = times
                    point["tflops"][impl] = {
                        name: None if ms is None else FLOPS_PER_FWD[name] * flops / (ms * 1e-3) / 1e12
                        for name, ms in times.items()
                    }
                    if errors:
                        point["errors"][impl] = errors
                points.append(point)
                print(f"d{headdim:<3d} s{seqlen:<5d} b{batch:<3d} h{nheads:<3d} causal={causal!s:5}  " + "  ".join(
                    f"{impl} " + "/".join(cell(t, ".4g") for t in point["tflops"][impl].values())
                    for impl in sweep["impls"]
                ) + "  TFLOP/s fwd/bwd/fwd+bwd", flush=True)
            del q, k, v, dout
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return points, False


def peak_memory_bytes(impl, q, k, v, dout, backward):
    """Peak bytes allocated by one forward (no_grad) or forward+backward, beyond what existed before."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with torch.set_grad_enabled(backward):
        out = attention(impl, q, k, v, causal=False)
        if backward:
            grads = torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    if backward:
        del grads
    return peak


def run_memory():
    shape = MEMORY_SHAPE
    q, k, v, dout = make_inputs(shape["batch"], shape["seqlen"], shape["nheads"], shape["headdim"],
                                torch.bfloat16, torch.device("cuda"))
    results = {}
    for impl in MEMORY_IMPLS:
        results[impl] = {}
        with backend_context(impl), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name, backward in (("fwd", False), ("fwd_bwd", True)):
                try:
                    peak_memory_bytes(impl, q, k, v, dout, backward)  # warm-up: plans, workspaces
                    results[impl][name] = peak_memory_bytes(impl, q, k, v, dout, backward)
                except (RuntimeError, NotImplementedError) as error:
                    results[impl][name] = None
                    results[impl][name + "_error"] = str(error).splitlines()[0]
                torch.cuda.empty_cache()
        print(f"memory {impl:9s} fwd {cell(gib(results[impl]['fwd']), '.3f')} GiB, "
              f"fwd+bwd {cell(gib(results[impl]['fwd_bwd']), '.3f')} GiB", flush=True)
    return {"shape": shape, "dtype": "bfloat16", "causal": False, "peak_bytes": results}


def run_training(device, dry_run):
    config = {} if dry_run else TRAIN_CONFIG
    warmup, steps = (DRY_TRAIN_WARMUP_STEPS, DRY_TRAIN_STEPS) if dry_run else (TRAIN_WARMUP_STEPS, TRAIN_STEPS)
    dataset = train_lm.CharDataset()
    results = {}
    for name, (attn, backend) in TRAIN_ATTN.items():
        model, optimizer, (x, y) = train_lm.make_model_and_batch(attn, device, seed=SEED, dataset=dataset,
                                                                 **config)
        try:
            with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
                first_loss = train_lm.train_step(model, optimizer, x, y).item()  # same weights, same batch
                for _ in range(warmup - 1):
                    train_lm.train_step(model, optimizer, x, y)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(steps):
                    loss = train_lm.train_step(model, optimizer, x, y)
                loss = loss.item()  # waits for the last step
                elapsed = time.perf_counter() - start
        except (RuntimeError, NotImplementedError) as error:
            results[name] = {"ms_per_step": None, "first_loss": None, "final_loss": None,
                             "error": str(error).splitlines()[0]}
            print(f"train {name:14s} failed: {results[name]['error']}", flush=True)
            continue
        finally:
            del model, optimizer
        results[name] = {"ms_per_step": 1e3 * elapsed / steps, "first_loss": first_loss, "final_loss": loss}
        print(f"train {name:14s} {results[name]['ms_per_step']:.1f} ms/step, loss {first_loss:.4f} at step 1, "
              f"{loss:.4f} after {warmup + steps} steps on one batch", flush=True)
    return {"config": config or "train_lm defaults", "warmup_steps": warmup, "steps": steps, "results": results}


def environment(device):
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch_version": torch.__version__,
        "flashattn_ext_version": flashattn_ext.__version__,
        "timer": "cpu perf_counter" if device.type == "cpu" else
                 "triton.testing.do_bench median" if do_bench is not None else "cuda events median",
    }
    if device.type == "cuda":
        info.update(gpu=torch.cuda.get_device_name(device), cuda_version=torch.version.cuda,
                    cudnn_version=torch.backends.cudnn.version())
    else:
        info["gpu"] = None
    return info


def gib(nbytes):
    return None if nbytes is None else nbytes / GIB


def cell(value, fmt):
    return "–" if value is None else format(value, fmt)


def markdown(report):
    env, impls = report["environment"], report["sweep"]["impls"]
    backends = [impl for impl in impls if impl != "ours"]
    lines = [
        "# GPU attention benchmark",
        "",
        f"{env['gpu'] or 'CPU (dry run)'}, torch {env['torch_version']}, CUDA {env.get('cuda_version')}, "
        f"cuDNN {env.get('cudnn_version')}, flashattn_ext {env['flashattn_ext_version']}, {env['date']}; "
        f"timer: {env['timer']}.",
        f"{report['sweep']['dtype']}, {report['sweep']['total_tokens']} tokens per call, hidden "
        f"{report['sweep']['hidden']}. TFLOP/s; ratios are ours ÷ backend (above 1: ours faster); – : "
        "unsupported, not implemented or not run."
        + (" Sweep stopped by --time-budget." if report["truncated"] else ""),
    ]
    for name, title in (("fwd", "Forward"), ("bwd", "Backward"), ("fwd_bwd", "Forward + backward")):
        if name not in report["sweep"]["passes"]:
            continue
        lines += [
            "", f"## {title}", "",
            "| head dim | causal | seqlen | batch × heads | " + " | ".join(impls) + " | "
            + " | ".join(f"ours/{b}" for b in backends) + " |",
            "|" + "---|" * (4 + len(impls) + len(backends)),
        ]
        for point in report["points"]:
            tflops = {impl: point["tflops"][impl][name] for impl in impls}
            ratios = [None if tflops["ours"] is None or tflops[b] is None else tflops["ours"] / tflops[b]
                      for b in backends]
            lines.append("| " + " | ".join([
                str(point["headdim"]), "yes" if point["causal"] else "no", str(point["seqlen"]),
                f"{point['batch']} × {point['nheads']}",
                *(cell(tflops[impl], ".4g") for impl in impls), *(cell(r, ".2f") for r in ratios),
            ]) + " |")
    memory = report.get("memory")
    if memory:
        shape = memory["shape"]
        lines += [
            "", f"## Peak memory beyond the inputs, B{shape['batch']} H{shape['nheads']} S{shape['seqlen']} "
            f"D{shape['headdim']} bf16, non-causal (GiB)", "",
            "| implementation | forward (no_grad) | forward + backward |", "|---|---|---|",
        ]
        for impl, peaks in memory["peak_bytes"].items():
            lines.append(f"| {impl} | {cell(gib(peaks['fwd']), '.3f')} | {cell(gib(peaks['fwd_bwd']), '.3f')} |")
    training = report.get("training")
    if training:
        lines += [
            "", f"## Training step of examples/train_lm.py ({training['config']}, "
            f"{training['steps']} timed steps after {training['warmup_steps']})", "",
            "| attention | ms/step | loss at step 1 | final loss |", "|---|---|---|---|",
        ]
        for name, result in training["results"].items():
            lines.append(f"| {name} | {cell(result['ms_per_step'], '.1f')} | {cell(result['first_loss'], '.4f')} "
                         f"| {cell(result['final_loss'], '.4f')} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--quick", action="store_true", help="head dims 64/128/256 at seqlen 2048 and 8192 only")
    parser.add_argument("--only", choices=("fwd", "bwd", "all"), default="all",
                        help="passes to time: fwd, bwd (backward and forward+backward) or all; "
                             "memory and training run with all only")
    parser.add_argument("--time-budget", type=float, default=float("inf"), metavar="SECONDS",
                        help="stop the run cleanly after this many seconds and write what it has")
    parser.add_argument("--dry-run", action="store_true", help="tiny sweep on the CPU, ours vs eager")
    args = parser.parse_args()

    sweep = dict(DRY_SWEEP if args.dry_run else FULL_SWEEP)
    if args.quick and not args.dry_run:
        sweep["seqlens"] = QUICK_SEQLENS
    device = torch.device(sweep["device"])
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --dry-run to exercise the script on the CPU")
    passes = {"fwd": ("fwd",), "bwd": ("bwd", "fwd_bwd"), "all": PASSES}[args.only]
    deadline = time.monotonic() + args.time_budget

    points, truncated = run_sweep(sweep, passes, deadline)
    report = {
        "environment": environment(device),
        "sweep": {**sweep, "dtype": str(sweep["dtype"]).removeprefix("torch."), "passes": list(passes)},
        "points": points,
        "truncated": truncated,
    }
    if args.only == "all":  # both are short: they run even when the sweep was cut by the time budget
        if device.type == "cuda":
            report["memory"] = run_memory()
        report["training"] = run_training(device, args.dry_run)

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "results.md").write_text(markdown(report))
    plotted = plot(report, args.out / "tflops.png")
    print(markdown(report))
    print(f"wrote {args.out}/results.json, results.md"
          + (", tflops.png" if plotted else " (matplotlib missing: no plot)"))


if __name__ == "__main__":
    main()
