"""CPU benchmark of decode-shaped attention: flash_attn_with_kvcache against torch's SDPA on the same inputs.

A few queries (seqlen_q 1 or 4) against a KV cache whose first `keys` rows are in use (cache_seqlens = keys,
no append), causal (bottom-right: query i sees keys [0, keys - seqlen_q + i]), fp32. Grid: threads 1 and 2,
seqlen_q 1 and 4, keys 256 ... 8192, batch 1 and 8, heads 16 / kv heads 4 (GQA) and 16 / 16 (MHA), head dim
64 and 128; points whose K + V pass MAX_KV_BYTES are skipped.

- ours: flashattn_ext.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=keys, causal=True);
- blocked: the same call with FLASHATTN_EXT_DISABLE_DECODE=1 (read per call by csrc/cpu/flash_cpu.c), i.e. the
        blocked-Q forward that ran these calls before the decode path (--impls ours sdpa leaves it out);
- sdpa: torch.nn.functional.scaled_dot_product_attention on (B, H, S, D) transposed views of the same
        tensors' used rows, enable_gqa=True for GQA, the bottom-right causal mask as a bool attn_mask
        (none for one query, which sees every key).

Each thread count runs in a child process of this script with OMP_NUM_THREADS set (torch and our OpenMP
runtime both read it at start). Time: wall clock; one sample is the mean of enough back-to-back calls to
last ~SAMPLE_SECONDS, the implementations alternate sample by sample, and each keeps the median of
SAMPLES samples. On a shared machine the wall times move with the other jobs: compare the columns
of one row (taken in alternation), not rows of different runs.

    python benchmarks/bench_cpu_decode.py --out benchmarks/results/cpu/decode_2026-12-03/decode   # the full grid
    python benchmarks/bench_cpu_decode.py --threads 1 --seqlens-q 1 --keys 2048 --batches 1 --heads 16/4 \
        --headdims 64          # one point

Output (--out PREFIX): PREFIX.json (the machine, and every point with its settings) and PREFIX.md (a table with
ours / blocked and ours / sdpa; below 1 means ours is faster).
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

THREADS = (1, 2)
SEQLENS_Q = (1, 4)
KEYS = (256, 1024, 2048, 4096, 8192)
BATCHES = (1, 8)
HEADS = ("16/4", "16/16")
HEADDIMS = (64, 128)
MAX_KV_BYTES = 600 * 2**20
SAMPLE_SECONDS = 0.02
SAMPLES = 7
SEED = 0
IMPLS = ("ours", "blocked", "sdpa")


def make_inputs(batch, seqlen_q, keys, nheads, nheads_kv, headdim, dtype=torch.float32):
    generator = torch.Generator().manual_seed(SEED)
    q = torch.randn(batch, seqlen_q, nheads, headdim, generator=generator).to(dtype)
    k_cache = torch.randn(batch, keys, nheads_kv, headdim, generator=generator).to(dtype)
    v_cache = torch.randn(batch, keys, nheads_kv, headdim, generator=generator).to(dtype)
    return q, k_cache, v_cache


def bottom_right_causal(seqlen_q, keys):
    """(seqlen_q, keys) bool, True where query i sees key j (j <= keys - seqlen_q + i); None for one query."""
    if seqlen_q == 1:
        return None
    i = torch.arange(seqlen_q).unsqueeze(1)
    j = torch.arange(keys).unsqueeze(0)
    return j <= keys - seqlen_q + i


def calls(q, k_cache, v_cache):
    keys = k_cache.shape[1]
    gqa = q.shape[2] != k_cache.shape[2]
    mask = bottom_right_causal(q.shape[1], keys)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k_cache, v_cache))
    def ours():
        return flashattn_ext.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=keys, causal=True)

    def blocked():
        os.environ["FLASHATTN_EXT_DISABLE_DECODE"] = "1"
        try:
            return ours()
        finally:
            del os.environ["FLASHATTN_EXT_DISABLE_DECODE"]

    return {
        "ours": ours,
        "blocked": blocked,
        "sdpa": lambda: F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=gqa).transpose(1, 2),
    }


def median_seconds(fns):
    """Per-call median seconds of each callable, the samples interleaved."""
    repeats = {}
    for name, fn in fns.items():
        fn()
        start = time.perf_counter()
        fn()
        repeats[name] = max(1, int(SAMPLE_SECONDS / max(time.perf_counter() - start, 1e-7)))
    times = {name: [] for name in fns}
    for _ in range(SAMPLES):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(repeats[name]):
                fn()
            times[name].append((time.perf_counter() - start) / repeats[name])
    return {name: statistics.median(t) for name, t in times.items()}


def grid(args):
    for seqlen_q in args.seqlens_q:
        for heads in args.heads:
            nheads, nheads_kv = map(int, heads.split("/"))
            for headdim in args.headdims:
                for batch in args.batches:
                    for keys in args.keys:
                        if 2 * batch * keys * nheads_kv * headdim * 4 <= MAX_KV_BYTES:
                            yield seqlen_q, nheads, nheads_kv, headdim, batch, keys


def child(args):
    """Runs with OMP_NUM_THREADS set: one JSON row per point on stdout."""
    for seqlen_q, nheads, nheads_kv, headdim, batch, keys in grid(args):
        q, k_cache, v_cache = make_inputs(batch, seqlen_q, keys, nheads, nheads_kv, headdim, getattr(torch, args.dtype))
        fns = {name: fn for name, fn in calls(q, k_cache, v_cache).items() if name in args.impls}
        with torch.no_grad():
            diff = (fns["ours"]() - fns["sdpa"]()).abs().max().item()
            seconds = median_seconds(fns)
        row = {"threads": torch.get_num_threads(), "seqlen_q": seqlen_q, "nheads": nheads, "nheads_kv": nheads_kv,
               "headdim": headdim, "batch": batch, "keys": keys, "max_abs_diff": diff,
               **{f"{impl}_us": 1e6 * seconds[impl] for impl in fns}}
        print(json.dumps(row), flush=True)


def machine_info():
    cpu_model = platform.processor()
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    return {"cpu_model": cpu_model, "cores": os.cpu_count(), "torch_version": torch.__version__,
            "flashattn_ext_version": flashattn_ext.__version__, "python_version": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def markdown(info, rows):
    lines = [f"# CPU decode: flash_attn_with_kvcache vs torch SDPA ({info['date'][:10]})", "",
             f"{info['cpu_model']}, {info['cores']} cores, torch {info['torch_version']}, {info['dtype']}, causal, "
             "wall time "
             "(median of interleaved samples). The machine is shared with other jobs: times are noisy (+-20%); "
             "compare ours and sdpa within a row.", "",
             "| threads | sq | heads | d | batch | keys | blocked (us) | ours (us) | sdpa (us) | ours / blocked | "
             "ours / sdpa | max abs diff |",
             "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        blocked = r.get("blocked_us")
        blocked_cells = ("-", "-") if blocked is None else (f"{blocked:.1f}", f"{r['ours_us'] / blocked:.2f}")
        lines.append(f"| {r['threads']} | {r['seqlen_q']} | {r['nheads']}/{r['nheads_kv']} | {r['headdim']} | "
                     f"{r['batch']} | {r['keys']} | {blocked_cells[0]} | {r['ours_us']:.1f} | {r['sdpa_us']:.1f} | "
                     f"{blocked_cells[1]} | {r['ours_us'] / r['sdpa_us']:.2f} | {r['max_abs_diff']:.1e} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=THREADS)
    parser.add_argument("--seqlens-q", type=int, nargs="+", default=SEQLENS_Q)
    parser.add_argument("--keys", type=int, nargs="+", default=KEYS)
    parser.add_argument("--batches", type=int, nargs="+", default=BATCHES)
    parser.add_argument("--heads", nargs="+", default=HEADS, help="nheads/nheads_kv")
    parser.add_argument("--headdims", type=int, nargs="+", default=HEADDIMS)
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=IMPLS, help="those to run (ours, sdpa always)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--out", type=pathlib.Path, help="prefix of the .json and .md files")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    rows = []
    args.impls = sorted(set(args.impls) | {"ours", "sdpa"}, key=IMPLS.index)
    grid_args = ["--dtype", args.dtype, "--impls", *args.impls, "--seqlens-q", *map(str, args.seqlens_q),
                 "--keys", *map(str, args.keys),
                 "--batches", *map(str, args.batches), "--heads", *args.heads, "--headdims", *map(str, args.headdims)]
    for threads in args.threads:
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        proc = subprocess.Popen([sys.executable, __file__, "--child", *grid_args], env=env, stdout=subprocess.PIPE,
                                text=True)
        for line in proc.stdout:
            row = json.loads(line)
            rows.append(row)
            blocked = f"blocked {row['blocked_us']:.1f} us, " if "blocked_us" in row else ""
            print(f"t{row['threads']} sq{row['seqlen_q']} h{row['nheads']}/{row['nheads_kv']} d{row['headdim']} "
                  f"b{row['batch']} keys{row['keys']}: {blocked}ours {row['ours_us']:.1f} us, sdpa "
                  f"{row['sdpa_us']:.1f} us ({row['ours_us'] / row['sdpa_us']:.2f}x), diff {row['max_abs_diff']:.1e}",
                  flush=True)
        if proc.wait() != 0:
            sys.exit(f"child with {threads} threads failed")
    if args.out:
        info = {**machine_info(), "dtype": args.dtype}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps({"machine": info, "rows": rows}, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(markdown(info, rows))


if __name__ == "__main__":
    main()
