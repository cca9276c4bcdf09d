"""GPU benchmark of decoding (one query token against a KV cache): flash_attn_with_kvcache (contiguous
and paged caches) and our dense flash_attn_func beside torch's SDPA backends, in one process on the
same inputs.

bf16, head dim 128, B8 and B1, H32 (and GQA H32 / KV8), cache 4k / 32k / 131k tokens, every row of the
cache in use (cache_seqlens = cache length), no append. Implementations:
- ours kvcache: flashattn_ext.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=...) (the decode
  kernel, split-KV count by its heuristic);
- ours kvcache 1 split: the same with num_splits=1 (the decode kernel without Flash-Decoding's split);
- ours kvcache paged: the same cache split into pages of PAGE_SIZE rows in a shuffled block_table;
- ours prefill kernel: flash_attn_func(q, k_cache, v_cache) with FLASHATTN_EXT_DISABLE_DECODE=1 (the
  128-row mma.sync forward, what decode ran before the decode kernel);
- SDPA default / cuDNN / flash / efficient: F.scaled_dot_product_attention on (B, H, 1, D) queries and
  the cache as (B, H_kv, S, D) transposed views (enable_gqa for GQA).
Bandwidth = bytes of K and V read (2 * B * S * H_kv * D * 2) / time: the figure of merit of decode (the
H200's HBM reads ~4.8 TB/s; cuDNN reached 4.69 TB/s at 131k in an earlier run). Medians by
bench_gpu.median_ms. Each output is compared with ours (max |difference|).

    python benchmarks/bench_decode.py --out benchmarks/results/h200/decode_2026-12-01
"""
import argparse
import contextlib
import json
import os
import pathlib
import sys

import torch
import torch.nn.functional as F

import flashattn_ext
from bench_gpu import SDPA_BACKENDS, SEED, backend_context, cell, environment, median_ms

BATCHES, NHEADS, HEADDIM = (8, 1), 32, 128
NHEADS_KV = (32, 8)
CACHE_LENS = (4096, 32768, 131072)
PAGE_SIZE = 256
BYTES = 2  # bf16


def sdpa(q, k, v, gqa):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          enable_gqa=gqa).transpose(1, 2)


@contextlib.contextmanager
def prefill_kernel():
    """Our fp16/bf16 forward without the decode kernel (launch.cu reads the variable per call)."""
    os.environ["FLASHATTN_EXT_DISABLE_DECODE"] = "1"
    try:
        yield
    finally:
        del os.environ["FLASHATTN_EXT_DISABLE_DECODE"]


def run():
    device = torch.device("cuda")
    rows = []
    for batch, hkv, s in ((b, hkv, s) for b in BATCHES for hkv in NHEADS_KV for s in CACHE_LENS):
        gen = torch.Generator(device=device).manual_seed(SEED)
        q = torch.randn(batch, 1, NHEADS, HEADDIM, device=device, dtype=torch.bfloat16, generator=gen)
        k, v = (torch.randn(batch, s, hkv, HEADDIM, device=device, dtype=torch.bfloat16, generator=gen)
                for _ in range(2))
        seqlens = torch.full((batch,), s, dtype=torch.int32, device=device)
        pages = batch * s // PAGE_SIZE
        perm = torch.randperm(pages, device=device, generator=gen)
        table = perm.view(batch, s // PAGE_SIZE).to(torch.int32)
        k_paged, v_paged = (torch.empty(pages, PAGE_SIZE, hkv, HEADDIM, device=device, dtype=torch.bfloat16)
                            for _ in range(2))
        k_paged[perm] = k.reshape(pages, PAGE_SIZE, hkv, HEADDIM)
        v_paged[perm] = v.reshape(pages, PAGE_SIZE, hkv, HEADDIM)
        gqa = hkv != NHEADS
        impls = {
            "ours kvcache": lambda: flashattn_ext.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens),
            "ours kvcache 1 split": lambda: flashattn_ext.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens,
                                                                                  num_splits=1),
            "ours kvcache paged": lambda: flashattn_ext.flash_attn_with_kvcache(
                q, k_paged, v_paged, cache_seqlens=seqlens, block_table=table),
            "ours prefill kernel": ("prefill", lambda: flashattn_ext.flash_attn_func(q, k, v)),
        }
        for backend in ("default",) + tuple(SDPA_BACKENDS):
            impls[f"SDPA {backend}"] = (backend, lambda: sdpa(q, k, v, gqa))
        read = 2 * batch * s * hkv * HEADDIM * BYTES
        ours = None
        for name, fn in impls.items():
            backend = None
            if isinstance(fn, tuple):
                backend, fn = fn
            row = {"batch": batch, "nheads_kv": hkv, "cache": s, "impl": name}
            try:
                ctx = prefill_kernel() if backend == "prefill" else backend_context(
                    backend if backend != "default" else None)
                with ctx:
                    out = fn()
                    ms = median_ms(fn, device)
                row.update(ms=ms, tb_per_s=read / ms / 1e9)
                if ours is None:
                    ours = out
                else:
                    row["max_abs_diff_vs_ours"] = (out.float() - ours.float()).abs().max().item()
            except Exception as exc:  # a backend that cannot run this is recorded, never fatal
                row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
        del k, v, k_paged, v_paged
        torch.cuda.empty_cache()
    return {"environment": environment(device), "batches": BATCHES, "nheads": NHEADS, "headdim": HEADDIM,
            "page_size": PAGE_SIZE, "rows": rows}


def markdown(report):
    env = report["environment"]
    lines = [f"# Decode benchmark ({env.get('gpu')}, torch {env['torch_version']}, {env['date']})", "",
             f"H{report['nheads']} D{report['headdim']} bf16, one query token, the whole "
             f"cache in use; paged: pages of {report['page_size']} rows in a shuffled table. TB/s of K+V read.",
             "", "| B | H_kv | cache | impl | ms | TB/s |", "|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['batch']} | {r['nheads_kv']} | {r['cache']} | {r['impl']} | {cell(r.get('ms'), '.3f')} | "
                     f"{cell(r.get('tb_per_s'), '.2f')} |" + (f" {r['error']}" if "error" in r else ""))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    report = run()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode.json").write_text(json.dumps(report, indent=1))
    (out / "decode.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
