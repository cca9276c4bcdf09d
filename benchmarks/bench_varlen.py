"""GPU benchmark of variable-length batches: flash_attn_varlen_func beside a dense call of the same
work and beside torch's own varlen paths, in one process on the same inputs.

bf16, 16k tokens per call in sequences of mixed lengths (drawn uniformly from [512, 4096] with a fixed
seed, the last one cut so that they sum to 16384), nheads = 2048 // headdim, head dims 64 and 128,
causal (bottom-right per sequence, the same as top-left here: sq = sk) and not. Implementations:
- ours varlen: flashattn_ext.flash_attn_varlen_func on the packed (total, nheads, d) tensors;
- ours dense, same work: flash_attn_func on a dense batch of B sequences of length L with B * L =
  16384 and B * L^2 = sum of the squared lengths (L rounded to a multiple of 64): the speed varlen
  should match (issue: within 5%);
- torch varlen_attn: torch.nn.attention.varlen.varlen_attn (torch's FlashAttention-2 kernel; the
  registry is not activated here, so torch's own kernel runs);
- SDPA nested: F.scaled_dot_product_attention on nested jagged tensors (torch's default backend
  choice for them).
TFLOP/s count the visible work: fwd = 4 * D * nheads * sum over sequences of the visible pairs
(s^2, or s (s + 1) / 2 causal), bwd = 2.5 * fwd; forward+backward ("fwd+bwd") = 3.5 * fwd. Times are
medians (bench_gpu.median_ms). Each forward output is compared with ours (max |difference|).
Anything a backend cannot run is recorded as null with its error.

    python benchmarks/bench_varlen.py --out benchmarks/results/h200/varlen_2026-12-01
    python benchmarks/bench_varlen.py --dry-run --out /tmp/vl     # tiny, on the CPU: ours only

Output in --out: varlen.json and varlen.md.
"""
import argparse
import inspect
import json
import pathlib
import random
import sys

import torch
import torch.nn.functional as F

import flashattn_ext
from bench_gpu import SEED, cell, environment, median_ms

TOTAL_TOKENS = 16384
HIDDEN = 2048
MIN_LEN, MAX_LEN = 512, 4096
HEADDIMS = (64, 128)
DENSE_ROUND = 64
BWD_FLOPS = 2.5  # backward FLOPs per forward FLOP
DRY = {"total": 512, "hidden": 64, "min": 16, "max": 128, "headdims": (32,)}


def draw_lengths(total, lo, hi, seed):
    rng = random.Random(seed)
    lengths = []
    while sum(lengths) < total:
        lengths.append(min(rng.randint(lo, hi), total - sum(lengths)))
    return lengths


def visible_pairs(lengths, causal):
    return sum(s * (s + 1) // 2 if causal else s * s for s in lengths)


def torch_varlen(q, k, v, cu, max_len, causal):
    from torch.nn.attention.varlen import varlen_attn
    params = inspect.signature(varlen_attn).parameters
    if "is_causal" in params:
        return varlen_attn(q, k, v, cu, cu, max_len, max_len, is_causal=causal)
    return varlen_attn(q, k, v, cu, cu, max_len, max_len, window_size=(-1, 0) if causal else (-1, -1))


def sdpa_nested(q, k, v, lengths, causal):
    offsets = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), device=q.device, dtype=torch.int64)

    def nest(t):  # (total, h, d) -> nested (b, j, h, d) -> (b, h, j, d)
        return torch.nested.nested_tensor_from_jagged(t, offsets).transpose(1, 2)

    return lambda: F.scaled_dot_product_attention(nest(q), nest(k), nest(v), is_causal=causal)


def packed(out):
    """(total, h, d) of an output: ours and varlen_attn's as they are, SDPA's nested (b, h, j, d) unnested."""
    return out.transpose(1, 2).values() if out.is_nested else out


def time_pair(fwd, inputs, device):
    """(forward ms, forward+backward ms) of fwd() -> out, the backward by torch.autograd.grad."""
    out = fwd()
    dout = torch.randn_like(packed(out))
    fwd_ms = median_ms(fwd, device)

    def step():
        torch.autograd.grad(packed(fwd()), inputs, dout)

    return fwd_ms, median_ms(step, device), out


def run(args):
    device = torch.device("cpu" if args.dry_run else "cuda")
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    total, hidden = (DRY["total"], DRY["hidden"]) if args.dry_run else (TOTAL_TOKENS, HIDDEN)
    lo, hi = (DRY["min"], DRY["max"]) if args.dry_run else (MIN_LEN, MAX_LEN)
    headdims = DRY["headdims"] if args.dry_run else HEADDIMS
    lengths = draw_lengths(total, lo, hi, SEED)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device=device)
    max_len = max(lengths)
    sum_sq = sum(s * s for s in lengths)
    dense_len = max(DENSE_ROUND, round(sum_sq / total / DENSE_ROUND) * DENSE_ROUND)
    rows = []
    for d in headdims:
        h = hidden // d
        gen = torch.Generator(device=device).manual_seed(SEED)
        q, k, v = (torch.randn(total, h, d, device=device, dtype=dtype, generator=gen).requires_grad_()
                   for _ in range(3))
        dense = [torch.randn(total // dense_len, dense_len, h, d, device=device, dtype=dtype, generator=gen)
                 .requires_grad_() for _ in range(3)]
        for causal in (False, True):
            flops = 4 * d * h * visible_pairs(lengths, causal)
            dense_flops = 4 * d * h * (total // dense_len) * visible_pairs([dense_len], causal)
            impls = {
                "ours varlen": (lambda: flashattn_ext.flash_attn_varlen_func(
                    q, k, v, cu, cu, max_len, max_len, causal=causal), (q, k, v), flops),
                "ours dense same work": (lambda: flashattn_ext.flash_attn_func(*dense, causal=causal),
                                         tuple(dense), dense_flops),
            }
            if not args.dry_run:
                impls["torch varlen_attn"] = (lambda: torch_varlen(q, k, v, cu, max_len, causal), (q, k, v), flops)
                impls["SDPA nested"] = (sdpa_nested(q, k, v, lengths, causal), (q, k, v), flops)
            ours_out = None
            for name, (fn, inputs, work) in impls.items():
                row = {"headdim": d, "nheads": h, "causal": causal, "impl": name}
                try:
                    fwd_ms, step_ms, out = time_pair(fn, inputs, device)
                    row.update(fwd_ms=fwd_ms, fwd_bwd_ms=step_ms, fwd_tflops=work / fwd_ms / 1e9,
                               bwd_tflops=BWD_FLOPS * work / (step_ms - fwd_ms) / 1e9,
                               fwd_bwd_tflops=(1 + BWD_FLOPS) * work / step_ms / 1e9)
                    flat = packed(out)
                    if name == "ours varlen":
                        ours_out = flat.detach()
                    elif name != "ours dense same work" and ours_out is not None:
                        row["max_abs_diff_vs_ours"] = (flat.detach().float() - ours_out.float()).abs().max().item()
                except Exception as exc:  # a backend that cannot run this is recorded, never fatal
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
    return {"environment": environment(device), "lengths": lengths, "dense_equivalent_seqlen": dense_len,
            "rows": rows}


def markdown(report):
    env = report["environment"]
    lines = [f"# Varlen benchmark ({env.get('gpu')}, torch {env['torch_version']}, {env['date']})", "",
             f"16k tokens in {len(report['lengths'])} sequences of {min(report['lengths'])}..."
             f"{max(report['lengths'])} tokens; dense same work: seqlen {report['dense_equivalent_seqlen']}. "
             "TFLOP/s of the visible work; ratio = ours varlen / that row.", "",
             "| d | causal | impl | fwd | bwd | fwd+bwd | ours/impl fwd | ours/impl bwd |",
             "|---|---|---|---|---|---|---|---|"]
    ours = {(r["headdim"], r["causal"]): r for r in report["rows"] if r["impl"] == "ours varlen"}
    for r in report["rows"]:
        o = ours.get((r["headdim"], r["causal"]), {})
        ratio = {p: (o.get(p) / r[p] if o.get(p) and r.get(p) else None) for p in ("fwd_tflops", "bwd_tflops")}
        lines.append(f"| {r['headdim']} | {r['causal']} | {r['impl']} | {cell(r.get('fwd_tflops'), '.0f')} | "
                     f"{cell(r.get('bwd_tflops'), '.0f')} | {cell(r.get('fwd_bwd_tflops'), '.0f')} | "
                     f"{cell(ratio['fwd_tflops'], '.2f')} | {cell(ratio['bwd_tflops'], '.2f')} |"
                     + (f" {r['error']}" if "error" in r else ""))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    report = run(args)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "varlen.json").write_text(json.dumps(report, indent=1))
    (out / "varlen.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
