"""Host time per attention call: ours beside torch's SDPA, in one process on the same inputs.

The time the calling thread spends per call, which bounds the throughput of short calls: on CUDA, N calls issued
without a synchronization (the kernels queue behind them; N is kept below the launch queue's depth) divided by N;
on the CPU, where a call computes, tiny shapes whose compute is small beside the call's overhead (one thread).
Rows: flash_attn_func (inputs without grad, and requiring grad: the autograd record of training), our
scaled_dot_product_attention (no mask, a bool mask), torch's F.scaled_dot_product_attention (its default backend on
the device), forward only; the backward (torch.autograd.grad of a forward) on both; a decode step (one query
against the s rows of a KV cache: flash_attn_with_kvcache, and our SDPA drop-in) beside torch's SDPA.

    python benchmarks/bench_host.py --out benchmarks/results/cpu/host_<date>            # CPU, one thread
    python benchmarks/bench_host.py --device cuda --out benchmarks/results/h200/host_<date>

Output: host.json (every number, the environment) and host.md (a table, us per call, and ours / torch's).
"""
import argparse
import datetime
import json
import pathlib
import platform
import statistics
import time

import torch
import torch.nn.functional as F

import flashattn_ext

REPEATS = 7  # medians of this many timed batches of calls
CALLS = {"cpu": 2000, "cuda": 200}  # calls per batch (CUDA: without a synchronization, below the queue depth)
# (batch, nheads, seqlen, headdim) of each device's rows: CPU tiny (its compute small beside the overhead); CUDA
# the short training shapes where host time nears kernel time (bf16)
SHAPES = {"cpu": [(1, 2, 16, 64), (4, 8, 32, 64)], "cuda": [(32, 16, 512, 128), (32, 32, 512, 64)]}


def per_call_us(fn, device, calls):
    for _ in range(3):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
        if device.type == "cuda":
            torch.cuda.synchronize()
    return statistics.median(times)


def rows_for(shape, device, dtype):
    b, h, s, d = shape
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, device=device, dtype=dtype, generator=gen) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    bhsd = lambda ts: [t.transpose(1, 2) for t in ts]  # noqa: E731  (SDPA's layout, views of the same tensors)
    qt, kt, vt = bhsd((q, k, v))
    qtg, ktg, vtg = bhsd((qg, kg, vg))
    mask = torch.ones(s, s, dtype=torch.bool, device=device).tril()
    q1 = torch.randn(b, 1, h, d, device=device, dtype=dtype, generator=gen)
    q1t = q1.transpose(1, 2)
    lens = torch.full((b,), s, device=device, dtype=torch.int32)
    dout = torch.randn(b, s, h, d, device=device, dtype=dtype, generator=gen)
    dout_t = dout.transpose(1, 2)
    ours_bwd = lambda: torch.autograd.grad(flashattn_ext.flash_attn_func(qg, kg, vg, causal=True), (qg, kg, vg),  # noqa
                                           dout)
    torch_bwd = lambda: torch.autograd.grad(F.scaled_dot_product_attention(qtg, ktg, vtg, is_causal=True),  # noqa
                                            (qtg, ktg, vtg), dout_t)
    return [
        ("forward, inputs without grad", lambda: flashattn_ext.flash_attn_func(q, k, v, causal=True),
         lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)),
        ("forward, inputs requiring grad", lambda: flashattn_ext.flash_attn_func(qg, kg, vg, causal=True),
         lambda: F.scaled_dot_product_attention(qtg, ktg, vtg, is_causal=True)),
        ("SDPA drop-in, no mask", lambda: flashattn_ext.scaled_dot_product_attention(qt, kt, vt, is_causal=True),
         lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)),
        ("SDPA drop-in, bool mask", lambda: flashattn_ext.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask),
         lambda: F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)),
        ("forward + backward", ours_bwd, torch_bwd),
        # one query against a KV cache of s rows, all in use (no append): flash_attn_with_kvcache, and the SDPA
        # drop-in on the same rows (a decode step of an LLM layer), beside torch's SDPA
        ("decode, KV cache", lambda: flashattn_ext.flash_attn_with_kvcache(q1, k, v, cache_seqlens=lens),
         lambda: F.scaled_dot_product_attention(q1t, kt, vt)),
        ("decode, SDPA drop-in", lambda: flashattn_ext.scaled_dot_product_attention(q1t, kt, vt),
         lambda: F.scaled_dot_product_attention(q1t, kt, vt)),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    results = []
    for shape in SHAPES[device.type]:
        for name, ours, theirs in rows_for(shape, device, dtype):
            a, b = per_call_us(ours, device, CALLS[device.type]), per_call_us(theirs, device, CALLS[device.type])
            results.append({"shape": list(shape), "call": name, "ours_us": a, "torch_us": b})
            print(f"{shape} {name}: ours {a:.1f} us, torch {b:.1f} us", flush=True)
    env = {"device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or
           platform.machine(), "torch": torch.__version__, "python": platform.python_version(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "threads": torch.get_num_threads(), "dtype": str(dtype).removeprefix("torch.")}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host.json").write_text(json.dumps({"environment": env, "results": results}, indent=2) + "\n")
    lines = [f"# Host time per call ({env['device']}, torch {env['torch']}, {env['dtype']}, {env['date']})", "",
             "| (batch, nheads, seqlen, headdim) | call | ours, us | torch SDPA, us | ours / torch |",
             "|---|---|---|---|---|"]
    lines += [f"| {tuple(r['shape'])} | {r['call']} | {r['ours_us']:.1f} | {r['torch_us']:.1f} | "
              f"{r['ours_us'] / r['torch_us']:.2f} |" for r in results]
    (args.out / "host.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}/host.json, host.md")


if __name__ == "__main__":
    main()
