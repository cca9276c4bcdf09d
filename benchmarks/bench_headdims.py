"""GPU benchmark of issue 36's head dims: q/k and v with head dims of their own (DeepSeek MLA prefill: 192 / 128)
beside the same FLOPs at one head dim (160 / 160), and head dim 512 (Gemma 4's global layers) beside 256, for ours,
torch's SDPA backends and FlexAttention, in one process on the same inputs.

bf16, 16k tokens per call (batch = 16384 // seqlen), 16 heads, seqlen 2k and 8k, causal and not. Forward, backward
and forward+backward median times (bench_gpu.median_ms) and TFLOP/s with fwd = 2·B·H·S²·(d_qk + d_v) (halved when
causal), bwd = 2.5 × fwd, fwd+bwd = 3.5 × fwd. A configuration a backend refuses (or that ours raises for) is null,
with its error. Ours gets (B, S, H, D) tensors, torch and Flex their (B, H, S, D) transposed views.

    python benchmarks/bench_headdims.py --out benchmarks/results/h200/headdims_DATE
    python benchmarks/bench_headdims.py --dry-run --out /tmp/dry     # tiny, on the CPU: ours beside SDPA's math

Output in --out: results.json (device, versions, every time and error), results.md (TFLOP/s per implementation,
ours ÷ each other implementation, and for each pair the ratio of ours to ours at the reference head dims).
"""
import argparse
import datetime
import json
import pathlib
import sys
import time
import warnings

import torch
import torch.nn.functional as F

import flashattn_ext

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_gpu import backend_context, median_ms  # noqa: E402

# (d_qk, d_v) pairs, each with the pair that it is compared to (same FLOPs, or the largest head dim before 512)
PAIRS = {(192, 128): (160, 160), (160, 160): None, (512, 512): (256, 256), (256, 256): None}
SEQLENS = (2048, 8192)
IMPLS = ("ours", "cudnn", "flash", "efficient", "flex")
TOTAL_TOKENS, NHEADS = 16384, 16
DRY = {"device": "cpu", "dtype": torch.float32, "total_tokens": 512, "nheads": 2, "seqlens": (128,),
       "impls": ("ours", "math"), "pairs": {(48, 32): (40, 40), (40, 40): None}}
FLOPS_PER_FWD = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}
SEED = 0

_flex = None


def flex_attention(q, k, v, causal):
    """FlexAttention (compiled once), causal through a block mask; q, k, v (B, H, S, D)."""
    global _flex
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention as flex
    if _flex is None:
        _flex = torch.compile(flex, dynamic=False)
    mask = None
    if causal:
        mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, q.shape[2], k.shape[2], device=q.device)
    return _flex(q, k, v, block_mask=mask)


def attention(impl, q, k, v, causal):
    if impl == "ours":
        return flashattn_ext.flash_attn_func(q, k, v, causal=causal)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    if impl == "flex":
        return flex_attention(qt, kt, vt, causal).transpose(1, 2)
    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)


def time_impl(impl, q, k, v, dout, causal, device):
    """{pass: ms or None}, {pass: error} for one implementation."""
    times, errors = dict.fromkeys(FLOPS_PER_FWD), {}
    context = backend_context(impl) if impl != "math" else torch.nn.attention.sdpa_kernel(
        torch.nn.attention.SDPBackend.MATH)
    with context, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            out = attention(impl, q, k, v, causal)
            times["fwd"] = median_ms(lambda: attention(impl, q, k, v, causal), device)
        except Exception as error:  # a backend's refusal, whatever its type, is a null with its reason
            return times, {"fwd": f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"}
        for name, fn in (("bwd", lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)),
                         ("fwd_bwd", lambda: torch.autograd.grad(attention(impl, q, k, v, causal), (q, k, v), dout))):
            try:
                times[name] = median_ms(fn, device)
            except Exception as error:
                errors[name] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return times, errors


def run(cfg, deadline):
    device = torch.device(cfg["device"])
    points, truncated = [], False
    for (dqk, dv) in cfg["pairs"]:
        for seqlen in cfg["seqlens"]:
            batch = cfg["total_tokens"] // seqlen
            generator = torch.Generator(device=device).manual_seed(SEED)

            def randn(d):
                return torch.randn(batch, seqlen, cfg["nheads"], d, generator=generator, dtype=cfg["dtype"],
                                   device=device)
            q, k, v, dout = randn(dqk).requires_grad_(), randn(dqk).requires_grad_(), randn(dv).requires_grad_(), randn(dv)
            for causal in (False, True):
                if time.monotonic() > deadline:
                    return points, True
                flops = 2 * batch * cfg["nheads"] * seqlen * seqlen * (dqk + dv) / (2 if causal else 1)
                point = {"d_qk": dqk, "d_v": dv, "batch": batch, "nheads": cfg["nheads"], "seqlen": seqlen,
                         "causal": causal, "ms": {}, "tflops": {}, "errors": {}}
                for impl in cfg["impls"]:
                    times, errors = time_impl(impl, q, k, v, dout, causal, device)
                    point["ms"][impl] = times
                    point["tflops"][impl] = {name: None if ms is None else FLOPS_PER_FWD[name] * flops / ms / 1e9
                                             for name, ms in times.items()}
                    if errors:
                        point["errors"][impl] = errors
                points.append(point)
    return points, truncated


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def markdown(points, cfg, meta):
    lines = [f"# Head dims of issue 36: {meta['device']}, torch {meta['torch']}, {meta['date']}", "",
             "TFLOP/s (fwd = 2·B·H·S²·(d_qk + d_v), halved when causal; bwd 2.5x, fwd+bwd 3.5x); `-`: refused or "
             "raised (results.json has the error). `vs ref`: ours here ÷ ours at the reference pair.", ""]
    others = [impl for impl in cfg["impls"] if impl != "ours"]
    head = "| d_qk / d_v | S | causal | pass | " + " | ".join(cfg["impls"]) + " | " + " | ".join(
        f"ours / {o}" for o in others) + " | vs ref |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    index = {(p["d_qk"], p["d_v"], p["seqlen"], p["causal"]): p for p in points}
    for p in points:
        ref_pair = cfg["pairs"][(p["d_qk"], p["d_v"])]
        ref = index.get((*ref_pair, p["seqlen"], p["causal"])) if ref_pair else None
        for name in FLOPS_PER_FWD:
            ours = p["tflops"]["ours"][name]
            ratios = [fmt(ours / p["tflops"][o][name] if ours and p["tflops"][o][name] else None, 2) for o in others]
            ref_ours = ref["tflops"]["ours"][name] if ref else None
            vs_ref = fmt(ours / ref_ours if ours and ref_ours else None, 2)
            lines.append(f"| {p['d_qk']} / {p['d_v']} | {p['seqlen']} | {'yes' if p['causal'] else 'no'} | {name} | "
                         + " | ".join(fmt(p["tflops"][i][name]) for i in cfg["impls"]) + " | " + " | ".join(ratios)
                         + f" | {vs_ref} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU, ours beside SDPA's math")
    parser.add_argument("--time-budget", type=float, default=600.0, help="seconds; the points after it are skipped")
    args = parser.parse_args()
    cfg = DRY if args.dry_run else {"device": "cuda", "dtype": torch.bfloat16, "total_tokens": TOTAL_TOKENS,
                                    "nheads": NHEADS, "seqlens": SEQLENS, "impls": IMPLS, "pairs": PAIRS}
    points, truncated = run(cfg, time.monotonic() + args.time_budget)
    device = torch.cuda.get_device_name() if cfg["device"] == "cuda" else "CPU"
    meta = {"device": device, "torch": torch.__version__, "date": datetime.date.today().isoformat(),
            "truncated": truncated}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "points": points,
                                                   "pairs": {f"{a}/{b}": r for (a, b), r in cfg["pairs"].items()}},
                                                  indent=1))
    (out / "results.md").write_text(markdown(points, cfg, meta))
    print((out / "results.md").read_text())


if __name__ == "__main__":
    main()
