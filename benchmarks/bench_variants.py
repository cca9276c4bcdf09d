"""GPU benchmark of the attention variants: flashattn_ext beside torch's best backend for each.

One process, bf16, 16k tokens per call (batch = 16384 // seqlen), nheads = 2048 // headdim, the
same inputs for every implementation (ours gets q, k, v as (B, S, H, D) tensors, torch their
(B, H, S, D) transposed views). Configurations (head dim 128 unless stated):
- dense rows, ours beside SDPA flash / cuDNN: the reference for "ours / our dense" (each variant
  is divided by our dense non-causal speed at its head dim and seqlen), and causal for comparison;
- causal sliding window 4096 at s16k: ours (window_size=(4095, 0), causal) vs FlexAttention (a
  block mask) and SDPA efficient (the band as a bool attn_mask (1, 1, S, S));
- softcap 50 at s8k, d128 and d256: ours vs Flex (score_mod with tanh);
- ALiBi causal at s8k: ours (alibi_slopes, the usual 2^(-8 (h+1) / H)) vs Flex (score_mod, causal block mask);
- T5's relative position bias (rel_bias, 32 buckets, max_distance 128, causal: T5's decoder buckets), a learnable
  table (its gradient computed in bwd): in bf16 at s8k Flex (score_mod gathering table[h, bucket(j - i)]) beside
  ours, which refuses rel_bias in fp16 / bf16 on CUDA (its error recorded); and in fp32 (the CUDA-core kernels
  of ours, the only ones with rel_bias on CUDA) at s2k, batch 1 ("simple_tokens"), ours with T5 beside ours with
  ALiBi (the cost of the table against ALiBi's in the same kernels) and the dense fp32 row (ratios ours/dense);
- padding mask at s8k, 25% of the keys padded (per batch element, lengths drawn with a fixed seed,
  their mean 25% to rounding), bool (B, 1, 1, Sk) and (B, 1, Sq, Sk): ours (scaled_dot_product_attention
  with attn_mask) vs SDPA cuDNN and SDPA efficient with the same mask;
- dropout 0.1 at s8k: ours vs SDPA flash with dropout_p (times only);
- block-sparse at s8k: 10% of the 128 x 128 blocks visible (the diagonal kept, the rest drawn with a
  fixed seed, the same for every batch element and head), no causal band: ours (bool attn_mask
  (1, 1, S, S)) vs Flex (block mask of the same blocks, all of them full).
FlexAttention is torch.compile(flex_attention); its block masks are built once per configuration,
outside the timed calls; ours reduces an attn_mask to its block flags inside every call (timed).

TFLOP/s count the visible work exactly: the visible (query, key) pairs of the band and mask,
summed over batch and heads; fwd = 4 * D * pairs, bwd = 2.5 * fwd. Times: medians by
triton.testing.do_bench when installed, else CUDA events (bench_gpu.median_ms). Backward: torch.
autograd.grad on a retained graph (where a backend refuses a second backward on one graph: the
forward+backward time minus the forward time, noted in the JSON). Each forward output is also
compared with ours (max |difference|, not for dropout), a check that both compute the same thing.
Anything a backend cannot run is recorded as null with its error and never stops the run. The
Flex calls (compilation included) run after all others, so that a --time-budget cut drops them first.

    python benchmarks/bench_variants.py --out benchmarks/results/h200/variants_DATE   # about 3 minutes
    python benchmarks/bench_variants.py --out /tmp/v --variants window softcap
    python benchmarks/bench_variants.py --dry-run --out /tmp/dry            # tiny, CPU, ours vs eager

Output in --out: variants.json (device, versions, every time, error and difference) and
variants.md (TFLOP/s tables; ratios ours / backend and ours / our dense, above 1 = ours faster).
"""
import argparse
import json
import math
import pathlib
import sys
import time
import warnings

import torch
import torch.nn.functional as F

import flashattn_ext
from bench_gpu import SDPA_BACKENDS, SEED, backend_context, cell, environment, make_inputs, median_ms

# "simple": the seqlen of the fp32 rows (ours on CUDA cores), simple_tokens their tokens per call
FULL_SCALE = {
    "device": "cuda", "dtype": torch.bfloat16, "total_tokens": 16384, "hidden": 2048,
    "seqlen": {"long": 16384, "short": 8192, "simple": 2048}, "simple_tokens": 2048, "window": 4096,
    "sparse_block": 128,
}
DRY_SCALE = {
    "device": "cpu", "dtype": torch.float32, "total_tokens": 1024, "hidden": 256,
    "seqlen": {"long": 512, "short": 256, "simple": 128}, "simple_tokens": 128, "window": 128, "sparse_block": 32,
}
SOFTCAP = 50.0
DROPOUT_P = 0.1
PADDING_FRACTION = 0.25
SPARSE_FRACTION = 0.10
ALIBI_MAX_BIAS = 8.0  # slopes 2^(-ALIBI_MAX_BIAS * (h + 1) / H), as in the ALiBi paper
T5_BUCKETS, T5_MAX_DISTANCE = 32, 128  # T5's defaults; causal rows: unidirectional buckets (T5's decoder)
FLOPS_PER_FWD = {"fwd": 1.0, "bwd": 2.5}
PASSES = ("fwd", "bwd")
FLEX_RECOMPILE_LIMIT = 64  # one compilation per configuration (score_mod, mask_mod, shapes)
# group: what --variants selects ("dense" always runs: the reference of every ratio); seqlen: a key of
# the scale's "seqlen"; impls: the implementations on the GPU (the dry run: ours and eager).
CONFIGS = (
    {"group": "dense", "name": "dense", "headdim": 128, "seqlen": "short", "impls": ("ours", "flash", "cudnn")},
    {"group": "dense", "name": "dense causal", "headdim": 128, "seqlen": "short", "causal": True,
     "impls": ("ours", "flash", "cudnn")},
    {"group": "dense", "name": "dense", "headdim": 128, "seqlen": "long", "impls": ("ours", "flash", "cudnn")},
    {"group": "dense", "name": "dense causal", "headdim": 128, "seqlen": "long", "causal": True,
     "impls": ("ours", "flash", "cudnn")},
    {"group": "dense", "name": "dense", "headdim": 256, "seqlen": "short", "impls": ("ours", "flash", "cudnn")},
    {"group": "window", "name": "causal window", "headdim": 128, "seqlen": "long", "causal": True, "window": True,
     "impls": ("ours", "flex", "efficient")},
    {"group": "softcap", "name": f"softcap {SOFTCAP:g}", "headdim": 128, "seqlen": "short", "softcap": SOFTCAP,
     "impls": ("ours", "flex")},
    {"group": "softcap", "name": f"softcap {SOFTCAP:g}", "headdim": 256, "seqlen": "short", "softcap": SOFTCAP,
     "impls": ("ours", "flex")},
    {"group": "alibi", "name": "ALiBi causal", "headdim": 128, "seqlen": "short", "causal": True, "alibi": True,
     "impls": ("ours", "flex")},
    {"group": "t5", "name": "T5 causal", "headdim": 128, "seqlen": "short", "causal": True, "t5": True,
     "impls": ("ours", "flex")},
    {"group": "t5", "name": "dense fp32", "headdim": 128, "seqlen": "simple", "dtype": "float32", "impls": ("ours",)},
    {"group": "t5", "name": "ALiBi causal fp32", "headdim": 128, "seqlen": "simple", "causal": True, "alibi": True,
     "dtype": "float32", "impls": ("ours",)},
    {"group": "t5", "name": "T5 causal fp32", "headdim": 128, "seqlen": "simple", "causal": True, "t5": True,
     "dtype": "float32", "impls": ("ours",)},
    {"group": "padding", "name": "padding (B,1,1,Sk)", "headdim": 128, "seqlen": "short", "padding": "keys",
     "impls": ("ours", "cudnn", "efficient")},
    {"group": "padding", "name": "padding (B,1,Sq,Sk)", "headdim": 128, "seqlen": "short", "padding": "full",
     "impls": ("ours", "cudnn", "efficient")},
    {"group": "dropout", "name": f"dropout {DROPOUT_P:g}", "headdim": 128, "seqlen": "short", "dropout": DROPOUT_P,
     "impls": ("ours", "flash")},
    {"group": "block_sparse", "name": f"block-sparse {SPARSE_FRACTION:.0%}", "headdim": 128, "seqlen": "short",
     "block_sparse": True, "impls": ("ours", "flex")},
)
GROUPS = tuple(dict.fromkeys(config["group"] for config in CONFIGS))
DRY_IMPLS = ("ours", "eager")
_flex = None


def flex_compiled():
    """torch.compile(flex_attention), built on first use (imports and compiles nothing before)."""
    global _flex
    if _flex is None:
        from torch.nn.attention.flex_attention import flex_attention
        torch._dynamo.config.recompile_limit = FLEX_RECOMPILE_LIMIT
        _flex = torch.compile(flex_attention, dynamic=False)
    return _flex


def alibi_slopes(nheads, device):
    """(H,) fp32: 2^(-ALIBI_MAX_BIAS * (h + 1) / H)."""
    exponents = torch.arange(1, nheads + 1, dtype=torch.float32, device=device) * (ALIBI_MAX_BIAS / nheads)
    return torch.pow(2.0, -exponents)


def t5_table(nheads, causal, device):
    """T5's learnable (H, T5_BUCKETS) fp32 table (seeded, requires grad) and the int32 bucket of each relative
    position -R .. R (R = T5_MAX_DISTANCE; flashattn_ext's own t5_buckets, checked against transformers' in
    tests/test_rel_bias.py): unidirectional for causal calls."""
    from flashattn_ext._checks import t5_buckets
    table = torch.randn(nheads, T5_BUCKETS, generator=torch.Generator().manual_seed(SEED)).to(device)
    buckets = t5_buckets(T5_BUCKETS, T5_MAX_DISTANCE, not causal, T5_MAX_DISTANCE, device)
    return table.requires_grad_(), buckets


def padding_mask(batch, seqlen, shape, device):
    """Bool key-padding mask, True = the key takes part: (B, 1, 1, Sk) or its (B, 1, Sq, Sk) copy.
    Batch element b keeps its first lengths[b] keys; the padded counts are a seeded random split of
    PADDING_FRACTION * B * Sk (each below Sk, so every query sees a key). Returns (mask, lengths)."""
    generator = torch.Generator().manual_seed(SEED)
    weights = torch.rand(batch, generator=generator, dtype=torch.float64)
    padded = (weights / weights.sum() * (PADDING_FRACTION * batch * seqlen)).round().long().clamp(max=seqlen - 1)
    lengths = seqlen - padded  # (B,)
    keys = torch.arange(seqlen)[None, :] < lengths[:, None]  # (B, Sk)
    mask = keys[:, None, None, :].to(device)  # (B, 1, 1, Sk)
    if shape == "full":
        mask = mask.expand(batch, 1, seqlen, seqlen).contiguous()
    return mask, lengths.tolist()


def block_pattern(seqlen, block, device):
    """(nblocks, nblocks) bool: the diagonal plus seeded random blocks, SPARSE_FRACTION of all in total."""
    nblocks = math.ceil(seqlen / block)
    pattern = torch.eye(nblocks, dtype=torch.bool)
    extra = max(round(SPARSE_FRACTION * nblocks * nblocks) - nblocks, 0)
    off_diagonal = (~pattern).flatten().nonzero().squeeze(1)
    chosen = off_diagonal[torch.randperm(off_diagonal.numel(), generator=torch.Generator().manual_seed(SEED))[:extra]]
    pattern.view(-1)[chosen] = True
    return pattern.to(device)


def band_mask(seqlen, diag_lo, diag_hi, device):
    """(S, S) bool: key j visible to query i iff diag_lo <= j - i <= diag_hi."""
    return torch.ones(seqlen, seqlen, dtype=torch.bool, device=device).tril(diag_hi).triu(diag_lo)


def build_case(config, scale):
    """Inputs, masks and exact visible work of one configuration (identical on every call: seeded)."""
    device = torch.device(scale["device"])
    dtype = getattr(torch, config["dtype"]) if "dtype" in config else scale["dtype"]
    headdim = config["headdim"]
    nheads = scale["hidden"] // headdim
    seqlen = scale["seqlen"][config["seqlen"]]
    batch = scale["simple_tokens" if config["seqlen"] == "simple" else "total_tokens"] // seqlen
    causal = config.get("causal", False)
    window = scale["window"] if config.get("window") else None
    q, k, v, dout = make_inputs(batch, seqlen, nheads, headdim, dtype, device)
    case = {
        "config": config, "batch": batch, "nheads": nheads, "seqlen": seqlen, "headdim": headdim,
        "causal": causal, "window": window, "q": q, "k": k, "v": v, "dout": dout,
        "softcap": config.get("softcap", 0.0), "dropout": config.get("dropout", 0.0),
        "slopes": alibi_slopes(nheads, device) if config.get("alibi") else None,
        "t5": t5_table(nheads, causal, device) if config.get("t5") else None, "dtype": dtype,
        "diag_lo": -(window - 1) if window else -seqlen, "diag_hi": 0 if causal else seqlen,
        "attn_mask": None, "pattern": None, "lengths": None, "sparse_block": scale["sparse_block"],
    }
    if config.get("padding"):
        case["attn_mask"], case["lengths"] = padding_mask(batch, seqlen, config["padding"], device)
    if config.get("block_sparse"):
        block = scale["sparse_block"]
        case["pattern"] = block_pattern(seqlen, block, device)
        rows = case["pattern"].repeat_interleave(block, 0).repeat_interleave(block, 1)[:seqlen, :seqlen]
        case["attn_mask"] = rows[None, None]  # (1, 1, S, S)
    band = band_mask(seqlen, case["diag_lo"], case["diag_hi"], device)
    case["band"] = band if causal or window else None
    visible = band if case["attn_mask"] is None else band & case["attn_mask"]
    # visible broadcasts to (B, H, S, S): every one of its entries stands for the same number of pairs
    case["pairs"] = int(visible.sum()) * (batch * nheads * seqlen * seqlen // visible.numel())
    case["visible"] = visible
    return case


def ours_call(case):
    q, k, v = case["q"], case["k"], case["v"]
    if case["attn_mask"] is not None:
        mask = case["attn_mask"]
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        return lambda: flashattn_ext.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask).transpose(1, 2)
    kwargs = {
        "causal": case["causal"], "window_size": (case["window"] - 1, 0) if case["window"] else (-1, -1),
        "softcap": case["softcap"], "alibi_slopes": case["slopes"], "dropout_p": case["dropout"],
    }
    if case["t5"] is not None:
        kwargs.update(rel_bias=case["t5"][0], rel_bias_max_distance=T5_MAX_DISTANCE,
                      rel_bias_bidirectional=not case["causal"])
    return lambda: flashattn_ext.flash_attn_func(q, k, v, **kwargs)


def sdpa_call(case):
    """torch SDPA (the backend chosen by the caller's sdpa_kernel): the band or mask as a bool attn_mask."""
    if case["softcap"] or case["slopes"] is not None or case["t5"] is not None:
        raise NotImplementedError("SDPA has no softcap / ALiBi / T5 bias")
    qt, kt, vt = (case[name].transpose(1, 2) for name in ("q", "k", "v"))
    mask = case["attn_mask"] if case["attn_mask"] is not None else (
        case["band"][None, None] if case["window"] else None)
    is_causal = case["causal"] and mask is None
    p = case["dropout"]
    return lambda: F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, dropout_p=p,
                                                  is_causal=is_causal).transpose(1, 2)


def score_hook(case):
    """The score modification of ours (softcap, then ALiBi or T5's table) on a scaled score s; None when none is
    on."""
    softcap, slopes, t5 = case["softcap"], case["slopes"], case["t5"]
    if not softcap and slopes is None and t5 is None:
        return None
    table, buckets = t5 if t5 is not None else (None, None)
    radius = T5_MAX_DISTANCE

    def score_mod(score, b, h, q_idx, kv_idx):
        if softcap:
            score = softcap * torch.tanh(score / softcap)
        if slopes is not None:  # |j - i - (sk - sq)| with sq = sk
            score = score - slopes[h] * (kv_idx - q_idx).abs()
        if table is not None:  # table[h, bucket(j - i)], positions past +-max_distance in its last bucket
            score = score + table[h, buckets[(kv_idx - q_idx).clamp(-radius, radius) + radius]]
        return score
    return score_mod


def eager_call(case):
    """softmax(score hook(q kᵀ · scale), masked) v written out on (B, H, S, D) views (dropout: F.dropout)."""
    qt, kt, vt = (case[name].transpose(1, 2) for name in ("q", "k", "v"))
    hook, visible, p = score_hook(case), case["visible"], case["dropout"]
    seqlen = case["seqlen"]
    rows = torch.arange(seqlen, device=qt.device)

    def call():
        scores = (qt @ kt.transpose(-2, -1)) * qt.shape[-1] ** -0.5  # (B, H, S, S)
        if hook is not None:
            heads = torch.arange(case["nheads"], device=qt.device)[:, None, None]
            scores = hook(scores, None, heads, rows[:, None], rows[None, :])
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        if p:
            probs = F.dropout(probs, p)
        return (probs @ vt).transpose(1, 2)
    return call


def flex_call(case):
    """Compiled FlexAttention: block mask from the band and block pattern, score_mod from score_hook."""
    from torch.nn.attention.flex_attention import create_block_mask
    if case["dropout"] or (case["attn_mask"] is not None and case["pattern"] is None):
        raise NotImplementedError("this benchmark gives Flex no dropout and no padding mask")
    qt, kt, vt = (case[name].transpose(1, 2) for name in ("q", "k", "v"))
    diag_lo, diag_hi, pattern, block = case["diag_lo"], case["diag_hi"], case["pattern"], case["sparse_block"]

    def mask_mod(b, h, q_idx, kv_idx):
        offset = kv_idx - q_idx
        keep = (offset >= diag_lo) & (offset <= diag_hi)
        if pattern is not None:
            keep = keep & pattern[q_idx // block, kv_idx // block]
        return keep
    seqlen = case["seqlen"]
    block_mask = None if case["band"] is None and pattern is None else create_block_mask(
        mask_mod, None, None, seqlen, seqlen, device=qt.device, BLOCK_SIZE=block)
    flex, score_mod = flex_compiled(), score_hook(case)
    return lambda: flex(qt, kt, vt, score_mod=score_mod, block_mask=block_mask).transpose(1, 2)


CALLS = {"ours": ours_call, "eager": eager_call, "flex": flex_call,
         **{name: sdpa_call for name in SDPA_BACKENDS}}


def first_line(error):
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def time_impl(impl, case, device, ours_out):
    """{"ms", "first_call_s", "errors", "max_abs_diff", "note"} of one implementation on one case.
    Errors of any type are recorded, never raised: a backend may fail in many ways (unsupported
    shape or mask, a compiler error inside torch.compile, not implemented in ours yet)."""
    result = {"ms": dict.fromkeys(PASSES), "first_call_s": dict.fromkeys(PASSES), "errors": {}, "max_abs_diff": None}
    inputs, dout = (case["q"], case["k"], case["v"]), case["dout"]
    with backend_context(impl), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch explains at length why a backend declines
        try:
            fn = CALLS[impl](case)
            start = time.perf_counter()
            out = fn()  # first call: compiles where the backend compiles
            if device.type == "cuda":
                torch.cuda.synchronize()
            result["first_call_s"]["fwd"] = time.perf_counter() - start
            result["ms"]["fwd"] = median_ms(fn, device)
        except Exception as error:  # noqa: BLE001 (see the docstring)
            result["errors"]["fwd"] = first_line(error)
            return result, None
        if ours_out is not None and not case["dropout"]:
            diff = (out.detach().float() - ours_out.float()).abs().max().item()
            if math.isfinite(diff):
                result["max_abs_diff"] = diff
            else:
                result["errors"]["out"] = f"non-finite output (max abs diff vs ours {diff})"
        try:
            start = time.perf_counter()
            torch.autograd.grad(out, inputs, dout, retain_graph=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            result["first_call_s"]["bwd"] = time.perf_counter() - start
            result["ms"]["bwd"] = median_ms(lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True), device)
        except Exception as retained_error:  # noqa: BLE001
            try:
                fwd_bwd = median_ms(lambda: torch.autograd.grad(fn(), inputs, dout), device)
                result["ms"]["bwd"] = fwd_bwd - result["ms"]["fwd"]
                result["note"] = ("bwd = (fwd+bwd) - fwd; a retained-graph backward failed: "
                                  + first_line(retained_error))
            except Exception as error:  # noqa: BLE001
                result["errors"]["bwd"] = first_line(error)
    return result, out.detach()


def new_record(config, case):
    """What one configuration is (shape, variant, exact visible work); its results go in "impls"."""
    return {
        "group": config["group"], "name": config["name"] + (f" {case['window']}" if case["window"] else ""),
        "headdim": case["headdim"], "seqlen": case["seqlen"], "batch": case["batch"], "nheads": case["nheads"],
        "causal": case["causal"], "window": case["window"], "softcap": case["softcap"] or None,
        "alibi": case["slopes"] is not None, "dropout_p": case["dropout"] or None,
        "t5_rel_bias": None if case["t5"] is None else {"num_buckets": T5_BUCKETS, "max_distance": T5_MAX_DISTANCE,
                                                        "bidirectional": not case["causal"]},
        "dtype": str(case["dtype"]).removeprefix("torch."),
        "padding_lengths": case["lengths"],
        "attn_mask_shape": None if case["attn_mask"] is None else list(case["attn_mask"].shape),
        "visible_pairs": case["pairs"],
        "visible_fraction": case["pairs"] / (case["batch"] * case["nheads"] * case["seqlen"] ** 2),
        "fwd_flops": 4 * case["headdim"] * case["pairs"], "impls": {},
    }


def run(scale, configs, impls_of, deadline):
    """Times every (configuration, implementation), Flex last; returns one record per configuration."""
    device = torch.device(scale["device"])
    records = [None] * len(configs)
    ours_outs = {}
    tasks = [(index, impl) for index, config in enumerate(configs) for impl in impls_of(config)]
    tasks.sort(key=lambda task: task[1] == "flex")  # stable: ours first within each configuration
    for index, impl in tasks:
        config = configs[index]
        case = build_case(config, scale)
        if records[index] is None:
            records[index] = new_record(config, case)
        record = records[index]
        if time.monotonic() > deadline:
            record["impls"][impl] = {"ms": dict.fromkeys(PASSES), "errors": {"fwd": "skipped: --time-budget"}}
        else:
            start = time.perf_counter()
            result, out = time_impl(impl, case, device, ours_outs.get(index))
            result["wall_s"] = time.perf_counter() - start
            if impl == "ours" and out is not None:
                ours_outs[index] = out
            record["impls"][impl] = result
        result = record["impls"][impl]
        result["tflops"] = {name: None if ms is None else FLOPS_PER_FWD[name] * record["fwd_flops"] / (ms * 1e-3) / 1e12
                            for name, ms in result["ms"].items()}
        print(f"{record['name']:22s} d{record['headdim']:<3d} s{record['seqlen']:<5d} {impl:9s} TFLOP/s fwd/bwd "
              + "/".join(cell(t, ".4g") for t in result["tflops"].values())
              + (f"  |diff| {result['max_abs_diff']:.3g}" if result.get("max_abs_diff") is not None else "")
              + (f"  ({result['wall_s']:.1f} s)" if "wall_s" in result else "")
              + "".join(f"  [{name}: {text}]" for name, text in result["errors"].items()), flush=True)
        del case
        if device.type == "cuda":
            torch.cuda.empty_cache()
    add_ratios(records)
    return records


def add_ratios(records):
    """ours / each backend, ours / our dense (non-causal, same head dim, seqlen and dtype), per pass."""
    dense = {(r["headdim"], r["seqlen"], r["dtype"]): r for r in records if r["name"] in ("dense", "dense fp32")}
    for record in records:
        ours = record["impls"]["ours"]["tflops"]
        reference = dense.get((record["headdim"], record["seqlen"], record["dtype"]))
        record["ratios"] = {
            "ours/dense": {name: ratio(ours[name], reference["impls"]["ours"]["tflops"][name] if reference else None)
                           for name in PASSES},
            **{f"ours/{impl}": {name: ratio(ours[name], result["tflops"][name]) for name in PASSES}
               for impl, result in record["impls"].items() if impl != "ours"},
        }


def ratio(a, b):
    return None if a is None or b is None else a / b


def best_backend(record, name):
    """(impl, TFLOP/s) of the fastest non-ours implementation in pass name, or (None, None)."""
    measured = [(result["tflops"][name], impl) for impl, result in record["impls"].items()
                if impl != "ours" and result["tflops"][name] is not None]
    if not measured:
        return None, None
    tflops, impl = max(measured)
    return impl, tflops


def markdown(report):
    env, records = report["environment"], report["configs"]
    lines = [
        "# Attention variants benchmark",
        "",
        f"{env['gpu'] or 'CPU (dry run)'}, torch {env['torch_version']}, CUDA {env.get('cuda_version')}, "
        f"cuDNN {env.get('cudnn_version')}, flashattn_ext {env['flashattn_ext_version']}, {env['date']}; "
        f"timer: {env['timer']}.",
        f"{report['scale']['dtype']}, {report['scale']['total_tokens']} tokens per call, hidden "
        f"{report['scale']['hidden']}. TFLOP/s on the visible work (fwd = 4·D·visible pairs, bwd = 2.5 × fwd); "
        "ratios above 1: ours faster; – : unsupported, failed or not run (errors in variants.json).",
        "",
        "## Ours against our dense and the best other backend",
        "",
        "| variant | head dim | seqlen | batch × heads | visible | ours fwd | ours bwd | ours/dense fwd | "
        "ours/dense bwd | best fwd | best bwd | ours/best fwd | ours/best bwd |",
        "|" + "---|" * 13,
    ]
    for r in records:
        ours = r["impls"]["ours"]["tflops"]
        best = {name: best_backend(r, name) for name in PASSES}
        lines.append("| " + " | ".join([
            r["name"], str(r["headdim"]), str(r["seqlen"]), f"{r['batch']} × {r['nheads']}",
            f"{r['visible_fraction']:.1%}", cell(ours["fwd"], ".4g"), cell(ours["bwd"], ".4g"),
            *(cell(r["ratios"]["ours/dense"][name], ".2f") for name in PASSES),
            *(f"{cell(best[name][1], '.4g')} {best[name][0] or ''}".strip() for name in PASSES),
            *(cell(ratio(ours[name], best[name][1]), ".2f") for name in PASSES),
        ]) + " |")
    lines += [
        "", "## Every backend", "",
        "| variant | head dim | seqlen | implementation | fwd | bwd | ours/impl fwd | ours/impl bwd | "
        "max abs diff of out vs ours |",
        "|" + "---|" * 9,
    ]
    for r in records:
        for impl, result in r["impls"].items():
            if impl == "ours":
                continue
            ratios = r["ratios"][f"ours/{impl}"]
            lines.append("| " + " | ".join([
                r["name"], str(r["headdim"]), str(r["seqlen"]), impl,
                *(cell(result["tflops"][name], ".4g") for name in PASSES),
                *(cell(ratios[name], ".2f") for name in PASSES), cell(result.get("max_abs_diff"), ".3g"),
            ]) + " |")
    if report["truncated"]:
        lines += ["", f"Stopped by --time-budget {report['time_budget_s']:g} s: skipped entries are –."]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--variants", nargs="+", choices=GROUPS, default=GROUPS, metavar="GROUP",
                        help=f"variant groups to run, of {', '.join(GROUPS)} (dense always runs)")
    parser.add_argument("--time-budget", type=float, default=float("inf"), metavar="SECONDS",
                        help="skip what is left after this many seconds (Flex runs last) and write what it has")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU, ours vs eager")
    args = parser.parse_args()

    scale = DRY_SCALE if args.dry_run else FULL_SCALE
    device = torch.device(scale["device"])
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --dry-run to exercise the script on the CPU")
    configs = [c for c in CONFIGS if c["group"] == "dense" or c["group"] in args.variants]
    start = time.monotonic()
    records = run(scale, configs, (lambda config: DRY_IMPLS) if args.dry_run else (lambda config: config["impls"]),
                  start + args.time_budget)
    report = {
        "environment": environment(device),
        "scale": {**scale, "dtype": str(scale["dtype"]).removeprefix("torch.")},
        "settings": {"softcap": SOFTCAP, "dropout_p": DROPOUT_P, "padding_fraction": PADDING_FRACTION,
                     "sparse_fraction": SPARSE_FRACTION, "alibi_max_bias": ALIBI_MAX_BIAS, "seed": SEED,
                     "t5_buckets": T5_BUCKETS, "t5_max_distance": T5_MAX_DISTANCE},
        "configs": records,
        "time_budget_s": args.time_budget if math.isfinite(args.time_budget) else None,
        "truncated": any(result["errors"].get("fwd") == "skipped: --time-budget"
                         for r in records for result in r["impls"].values()),
        "wall_s": time.monotonic() - start,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "variants.json").write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    (args.out / "variants.md").write_text(markdown(report))
    print(markdown(report))
    print(f"wrote {args.out}/variants.json, variants.md in {report['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
