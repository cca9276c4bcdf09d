"""Cost of flash_attn_with_kvcache(check_cache_seqlens=True) on a decode step: one new token per sequence
appended to a dense or paged cache, then attention over the cache rows in use, with and without the check
(which reads cache_seqlens on the host: a device synchronization on CUDA). Runs the two in alternating
rounds of torch.utils.benchmark (which synchronizes CUDA around each timing) and prints the medians, then
the check alone (_checks._check_seqlens_fit), whose cost is below the noise of a whole step on a shared CPU,
and the append alone (the op flashattn_ext::kv_append writing both caches).

    python benchmarks/bench_kvcache_check.py                 # CPU, float32
    python benchmarks/bench_kvcache_check.py --device cuda   # CUDA, bfloat16
"""
import argparse
import statistics

import torch
from torch.utils import benchmark

import flashattn_ext
from flashattn_ext import _core
from flashattn_ext._checks import _check_seqlens_fit

NHEADS, NHEADS_KV, HEADDIM, PAGE_SIZE = 16, 4, 64, 256
SHAPES = ((1, 256), (8, 256), (1, 4096), (8, 4096))  # (batch, cache rows per sequence)


def decode_inputs(batch, rows, paged, dtype, device):
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)

    t = dict(q=rnd(batch, 1, NHEADS, HEADDIM), k=rnd(batch, 1, NHEADS_KV, HEADDIM), v=rnd(batch, 1, NHEADS_KV, HEADDIM),
             cache_seqlens=torch.randint(rows // 2, rows, (batch,), generator=gen, dtype=torch.int32).to(device))
    if paged:
        pages = rows // PAGE_SIZE if rows >= PAGE_SIZE else 1
        size = rows // pages
        t["block_table"] = torch.randperm(batch * pages, generator=gen).view(batch, pages).to(torch.int32).to(device)
        shape = (batch * pages, size, NHEADS_KV, HEADDIM)
    else:
        shape = (batch, rows, NHEADS_KV, HEADDIM)
    t["k_cache"], t["v_cache"] = rnd(*shape), rnd(*shape)
    return t


def step(t, check):
    # the same rows every step (cache_seqlens is not advanced), so the cache never fills up
    return flashattn_ext.flash_attn_with_kvcache(t["q"], t["k_cache"], t["v_cache"], t["k"], t["v"],
                                                 cache_seqlens=t["cache_seqlens"], block_table=t.get("block_table"),
                                                 causal=True, check_cache_seqlens=check)


def append(t):
    """The append of a step alone: the op flashattn_ext::kv_append (both caches)."""
    _core.kv_append(k_cache=t["k_cache"], v_cache=t["v_cache"], k=t["k"], v=t["v"], cache_seqlens=t["cache_seqlens"],
                    block_table=t.get("block_table"))


def median_us(stmt, min_run_time, **names):
    return benchmark.Timer(stmt, globals=names).blocked_autorange(min_run_time=min_run_time).median * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-run-time", type=float, default=0.2)
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    print(f"device {device}, {dtype}, torch {torch.__version__}, threads {torch.get_num_threads()}, nheads "
          f"{NHEADS}/{NHEADS_KV}, head dim {HEADDIM}")
    print("| cache | batch | rows | unchecked (us) | checked (us) | difference (us) | relative |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for paged in (False, True):
        for batch, rows in SHAPES:
            t = decode_inputs(batch, rows, paged, dtype, device)
            times = {False: [], True: []}
            for _ in range(args.rounds):
                for check in (False, True):
                    times[check].append(median_us("step(t, check)", args.min_run_time, step=step, t=t, check=check))
            off, on = statistics.median(times[False]), statistics.median(times[True])
            print(f"| {'paged' if paged else 'dense'} | {batch} | {rows} | {off:.1f} | {on:.1f} | {on - off:+.1f} | "
                  f"{(on - off) / off:+.1%} |")
    for batch in sorted({b for b, _ in SHAPES}):
        seqlens = torch.zeros(batch, dtype=torch.int32, device=device)
        alone = statistics.median(median_us("check('flash_attn_with_kvcache', seqlens, 1, 4096, None)", args.min_run_time,
                                            check=_check_seqlens_fit, seqlens=seqlens) for _ in range(args.rounds))
        print(f"the check alone, batch {batch}: {alone:.1f} us")
    for paged in (False, True):
        for batch, rows in SHAPES:
            t = decode_inputs(batch, rows, paged, dtype, device)
            alone = statistics.median(median_us("append(t)", args.min_run_time, append=append, t=t)
                                      for _ in range(args.rounds))
            print(f"the append alone (kv_append), {'paged' if paged else 'dense'}, batch {batch}, rows {rows}: "
                  f"{alone:.1f} us")


if __name__ == "__main__":
    main()
