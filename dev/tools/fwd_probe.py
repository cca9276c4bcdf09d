"""fwd_probe.py: on the GPU machine, ours against cuDNN (SDPA's default on the H200) on a few forward points, in
rounds that alternate the two, each timed three ways: triton's do_bench (cold L2, as benchmarks/bench_gpu.py),
CUDA events over back-to-back calls (warm L2), and the kernels' own durations from torch.profiler (what the
GPU spent in kernels per call, launch gaps excluded).

    python3 dev/tools/fwd_probe.py [--points d:s:causal ...] [--rounds N] [--json FILE]
"""
import argparse
import json
import pathlib
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_gpu import attention, backend_context, median_ms  # noqa: E402

TOKENS, HIDDEN = 16384, 2048
EVENT_RUNS, PROFILED_RUNS = 50, 20


def run(impl, q, k, v, causal):
    """bench_gpu.py's call of impl ("ours" or "cudnn") under its backend context."""
    with backend_context(impl):
        return attention(impl, q, k, v, causal)


def event_ms(fn):
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(EVENT_RUNS):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / EVENT_RUNS


def kernel_ms(fn):
    """Summed device time of the kernels of one call (median over PROFILED_RUNS calls) and their names."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED_RUNS):
            fn()
        torch.cuda.synchronize()
    totals = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] = totals.get(event.name, 0.0) + event.device_time_total
    return sum(totals.values()) / PROFILED_RUNS / 1e3, {n: t / PROFILED_RUNS / 1e3 for n, t in totals.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", nargs="*", default=["128:1024:1", "128:2048:1", "128:2048:0", "64:2048:1",
                                                         "256:2048:1", "128:8192:1"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    results = []
    for point in args.points:
        d, s, causal = (int(x) for x in point.split(":"))
        b, h = TOKENS // s, HIDDEN // d
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        row = {"d": d, "s": s, "causal": bool(causal), "rounds": []}
        for _ in range(args.rounds):
            entry = {}
            for impl in ("ours", "cudnn"):
                fn = lambda: run(impl, q, k, v, bool(causal))  # noqa: E731
                cold = median_ms(fn, q.device)  # bench_gpu.py's own timing
                warm = event_ms(fn)
                kern, names = kernel_ms(fn)
                entry[impl] = {"do_bench_ms": cold, "event_ms": warm, "kernel_ms": kern,
                               "tflops_do_bench": flops / cold / 1e9, "tflops_kernel": flops / kern / 1e9,
                               "kernels": names}
            row["rounds"].append(entry)
            print(f"d{d} s{s} causal={causal}: " + "  ".join(
                f"{impl} do_bench {e['tflops_do_bench']:.0f} events {flops / e['event_ms'] / 1e9:.0f} "
                f"kernel {e['tflops_kernel']:.0f} TFLOP/s" for impl, e in entry.items()) +
                f"  ours/cudnn {entry['cudnn']['do_bench_ms'] / entry['ours']['do_bench_ms']:.3f}", flush=True)
        for impl in ("ours", "cudnn"):
            print(f"   {impl} kernels: " + ", ".join(f"{n[:60]} {t * 1e3:.1f} us"
                                                     for n, t in row["rounds"][-1][impl]["kernels"].items()))
        results.append(row)
        del q, k, v
    if args.json:
        args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "points": results}, indent=1))


if __name__ == "__main__":
    main()
