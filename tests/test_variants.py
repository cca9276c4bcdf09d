"""The attention variants of issue 10 (sliding window, softcap, ALiBi, sinks, attn_mask, dropout), each
alone and every pair of them, forward (out, lse) and backward (dq, dk, dv, d sink, d attn_mask) against
the independent float64 reference of fa_testing.py, through flash_attn_func, scaled_dot_product_attention
and the ops (top-left alignment); rows without keys; gradcheck; torch.compile; opcheck; dropout's
statistics, its Philox stream and its seeding. CPU in CI; the same tests on CUDA (skipped without one)."""
import dataclasses
import itertools
import math

import pytest
import torch

import flashattn_ext
from flashattn_ext.reference import attention_probs, attention_ref
from fa_testing import (
    DEVICES,
    DTYPE_NAMES,
    OUT_TOL,
    Cfg,
    Var,
    assert_close,
    assert_sum_close,
    causal_mask,
    attention64,
    check_variant_results,
    device_dtype_params,
    expected_lse_dtype,
    grad_tol,
    keep_probability,
    make_inputs,
    make_variant_tensors,
    op_bwd_args,
    op_fwd_args,
    philox_keep_mask,
    replay_keep_mask,
    requires_cuda,
    run_flash,
    run_sdpa,
    variant_grad_inputs,
    variant_grad_names,
    variant_reference,
)

DROPOUT_SEED = 1234
SIGMAS = 5.0  # statistical bounds of the dropout tests

# Shapes every variant runs on: causal with sq < sk and GQA 2; sq > sk with GQA 3, (B, H, S, D) strides and
# more than one 64-row tile; causal sq > sk with padded rows (bottom-right: its first 15 rows see no key).
SHAPES = [
    Cfg(2, 37, 53, 4, 2, 16, causal=True),
    Cfg(1, 70, 45, 6, 2, 8, layout="bhsd"),
    Cfg(2, 45, 30, 2, 2, 32, causal=True, scale=0.4, layout="slice"),
]

# One setting of each variant, for the pairs.
FEATURES = {
    "window": Var(window=(11, 5)),
    "softcap": Var(softcap=1.0),
    "alibi": Var(alibi="bh"),
    "sink": Var(sink=True),
    "mask_bool": Var(mask="bool", mask_dims="b1qk"),
    "mask_add": Var(mask="add", mask_dims="1hqk"),
    "dropout": Var(dropout=0.17),
}


def merge(*vars_):
    """The Var with every non-default field of each of vars_ (they set disjoint fields)."""
    fields = {}
    default = Var()
    for var in vars_:
        for f in dataclasses.fields(Var):
            value = getattr(var, f.name)
            if value != getattr(default, f.name):
                assert f.name not in fields or fields[f.name] == value, f.name
                fields[f.name] = value
    return Var(**fields)


SINGLES = list(FEATURES.values()) + [
    Var(window=(9, -1)),
    Var(window=(-1, 4)),
    Var(window=(0, 0)),
    Var(alibi="h"),
    Var(mask="bool", mask_dims="bhqk"),
    Var(mask="bool", mask_dims="qk"),
    Var(mask="bool", mask_dims="b11k"),
    Var(mask="bool", mask_dims="bhqk", mask_pattern="blocks"),
    Var(mask="add", mask_dims="bhqk"),
    Var(mask="add", mask_dims="qk"),
    Var(mask="add", mask_dims="1h1k"),
    Var(mask="add", mask_dims="b11k"),
    Var(mask="add", mask_dims="b1qk", mask_pattern="blocks"),
    Var(dropout=0.5),
]
PAIRS = [merge(FEATURES[a], FEATURES[b]) for a, b in itertools.combinations(FEATURES, 2)
         if {a, b} != {"mask_bool", "mask_add"}]
EVERYTHING = merge(*(FEATURES[n] for n in ("window", "softcap", "alibi", "sink", "mask_add", "dropout")))
VARIANTS = SINGLES + PAIRS + [EVERYTHING]
assert len({v.id for v in VARIANTS}) == len(VARIANTS)


def variant_params(variants, shapes, pairs=None):
    out = []
    for dev, dt in pairs if pairs is not None else [p.values for p in device_dtype_params()]:
        for cfg in shapes:
            for var in variants:
                marks = [requires_cuda] if dev == "cuda" else []
                out.append(pytest.param(cfg, var, dev, dt, id=f"{dev}-{DTYPE_NAMES[dt]}-{cfg.id}-{var.id}",
                                        marks=marks))
    return out


DEVICE_DTYPE_PAIRS = [("cpu", dt) for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64)] + [
    ("cuda", dt) for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64)]


def grads_dict(names_inputs, grads):
    return {name: g for name, g in zip(names_inputs, grads)}


def check_grad_dtypes(got, tensors):
    if "dsink" in got:
        assert got["dsink"].dtype == tensors["sink"].dtype and got["dsink"].shape == tensors["sink"].shape
    if "dmask" in got:
        m = tensors["attn_mask"]
        assert got["dmask"].dtype == m.dtype and got["dmask"].shape == m.shape


def run_and_check(cfg, var, device, dtype, api="flash"):
    q, k, v, dout = make_inputs(cfg, dtype, device)
    t = make_variant_tensors(cfg, var, dtype, device)
    keep = replay_keep_mask(q, k, v, cfg, var, t, DROPOUT_SEED, bottom_right=api == "flash") if var.dropout else None
    torch.manual_seed(DROPOUT_SEED)
    if api == "flash":
        out, lse = run_flash(q, k, v, cfg, var, t)
        assert lse.dtype == expected_lse_dtype(dtype) and lse.shape == (cfg.b, cfg.h, cfg.sq)
    else:
        out, lse = run_sdpa(q, k, v, cfg, var, t), None
    assert out.dtype == dtype and out.shape == q.shape and out.device.type == device
    names = variant_grad_names(t)
    got = grads_dict(names, torch.autograd.grad(out, variant_grad_inputs(q, k, v, t), dout))
    got.update(out=out, lse=lse)
    check_grad_dtypes(got, t)
    ref = variant_reference(q, k, v, dout, cfg, var, t, keep=keep, bottom_right=api == "flash")
    check_variant_results(got, ref, dtype)


# ----------------------------------------------------------------------------------------------
# Every variant and every pair, against the float64 reference
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg, var, device, dtype", variant_params(VARIANTS, SHAPES, DEVICE_DTYPE_PAIRS))
def test_flash_attn_func_variant(cfg, var, device, dtype):
    run_and_check(cfg, var, device, dtype, "flash")


SDPA_SHAPES = [
    Cfg(2, 37, 53, 4, 2, 16),
    Cfg(1, 70, 45, 6, 2, 8, layout="bhsd"),
    Cfg(2, 45, 30, 2, 2, 32, causal=True, scale=0.4, layout="slice"),   # top-left causal: dropout only
]
SDPA_VARIANTS = [v for v in SINGLES + PAIRS if v.sdpa_ok] + [Var(mask="bool", mask_dims="hqk"),
                                                             Var(mask="add", mask_dims="k")]


def sdpa_params():
    return [p for p in variant_params(SDPA_VARIANTS, SDPA_SHAPES, DEVICE_DTYPE_PAIRS)
            if not (p.values[0].causal and p.values[1].mask)]  # attn_mask with is_causal raises (test_errors)


@pytest.mark.parametrize("cfg, var, device, dtype", sdpa_params())
def test_sdpa_variant(cfg, var, device, dtype):
    """torch's signature: attn_mask (bool / additive, any broadcast shape), dropout_p, top-left is_causal."""
    run_and_check(cfg, var, device, dtype, "sdpa")


TOP_LEFT_VARIANTS = [Var(window=(11, 5)), Var(window=(0, -1)), merge(FEATURES["window"], FEATURES["softcap"]),
                     merge(FEATURES["window"], FEATURES["sink"]), merge(FEATURES["window"], FEATURES["alibi"]),
                     merge(FEATURES["window"], FEATURES["mask_add"]), merge(FEATURES["window"], FEATURES["dropout"])]


@pytest.mark.parametrize("cfg, var, device, dtype", variant_params(TOP_LEFT_VARIANTS, SHAPES, DEVICE_DTYPE_PAIRS))
def test_op_top_left_variant(cfg, var, device, dtype):
    """The fwd op with bottom_right=False: window and causal aligned at j - i = 0 (ALiBi keeps its
    i + sk - sq - j distance); autograd through the op; dropout's keep mask from the rng_state it returns."""
    q, k, v, dout = make_inputs(cfg, dtype, device)
    t = make_variant_tensors(cfg, var, dtype, device)
    out, lse, rng_state, _ = torch.ops.flashattn_ext.fwd(*op_fwd_args(q, k, v, cfg, var, t, bottom_right=False))
    assert rng_state.dtype == torch.int64 and rng_state.shape == (2,) and rng_state.device.type == "cpu"
    keep = torch.ops.flashattn_ext.dropout_mask(q.detach(), rng_state, cfg.sk, var.dropout) if var.dropout else None
    names = variant_grad_names(t)
    got = grads_dict(names, torch.autograd.grad(out, variant_grad_inputs(q, k, v, t), dout))
    got.update(out=out, lse=lse)
    ref = variant_reference(q, k, v, dout, cfg, var, t, keep=keep, bottom_right=False)
    check_variant_results(got, ref, dtype)


@pytest.mark.parametrize("cfg", [Cfg(1, 1, 300, 4, 1, 64, causal=True), Cfg(2, 300, 1, 2, 2, 8),
                                 Cfg(1, 200, 130, 2, 1, 128, layout="mixed")], ids=lambda c: c.id)
@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_everything_long_rows(device, dtype, cfg):
    """Every variant at once on a decode row, a single key, and several key tiles with head dim 128."""
    var = dataclasses.replace(EVERYTHING, window=(90, 7))
    run_and_check(cfg, var, device, dtype, "flash")


def test_variant_lists_cover_the_issue():
    names = set(FEATURES)
    assert len(PAIRS) == len(list(itertools.combinations(names, 2))) - 1
    assert {v.mask_dims for v in VARIANTS if v.mask} >= {"bhqk", "b1qk", "1hqk", "qk", "b11k", "1h1k"}
    assert any(v.mask_pattern == "blocks" for v in VARIANTS if v.mask == "bool")
    assert any(v.mask_pattern == "blocks" for v in VARIANTS if v.mask == "add")
    assert {c.layout for c in SHAPES} >= {"contig", "bhsd", "slice"}
    assert any(c.h != c.hkv for c in SHAPES) and any(c.causal for c in SHAPES) and any(c.sq > c.sk for c in SHAPES)


# ----------------------------------------------------------------------------------------------
# Rows that see no key
# ----------------------------------------------------------------------------------------------

EMPTY_ROW_CASES = [
    (Cfg(2, 40, 20, 4, 2, 16), Var(window=(3, 2))),                       # rows 0..17: the band is left of key 0
    (Cfg(2, 40, 20, 4, 2, 16), Var(window=(3, 2), sink=True, softcap=2.0)),
    (Cfg(2, 33, 47, 4, 2, 16, causal=True), Var(mask="bool", mask_dims="bhqk")),
    (Cfg(3, 33, 47, 2, 1, 16), Var(mask="bool", mask_dims="b11k")),      # batch 2 wholly padded
    (Cfg(3, 33, 47, 2, 1, 16), Var(mask="add", mask_dims="b11k", sink=True)),
    (Cfg(2, 33, 47, 4, 2, 16), Var(mask="add", mask_dims="bhqk", alibi="h", dropout=0.3)),
    (Cfg(2, 70, 40, 2, 2, 8, causal=True), Var(mask="add", mask_dims="b1qk", mask_pattern="blocks", window=(20, -1))),
]


@pytest.mark.parametrize("cfg, var", EMPTY_ROW_CASES, ids=lambda x: x.id)
@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_rows_without_keys(device, dtype, cfg, var):
    """A query row that sees no key (band or mask): out exactly 0, lse -inf (the sink with a sink), dq 0,
    d mask 0 on the row; no NaN anywhere; the rest matches the reference."""
    q, k, v, dout = make_inputs(cfg, dtype, device)
    t = make_variant_tensors(cfg, var, dtype, device)
    keep = replay_keep_mask(q, k, v, cfg, var, t, DROPOUT_SEED) if var.dropout else None
    torch.manual_seed(DROPOUT_SEED)
    out, lse = run_flash(q, k, v, cfg, var, t)
    names = variant_grad_names(t)
    got = grads_dict(names, torch.autograd.grad(out, variant_grad_inputs(q, k, v, t), dout))
    for name, x in list(got.items()) + [("out", out), ("lse", lse)]:
        assert not torch.isnan(x).any(), f"NaN in {name}"
    # the rows without keys, from the reference without the sink
    _, lse_nosink = attention64(q.detach().cpu(), k.detach().cpu(), v.detach().cpu(), cfg.scale, cfg.causal,
                                window=var.window, softcap=var.softcap, alibi_slopes=None if t["alibi_slopes"] is None
                                else t["alibi_slopes"].cpu(), attn_mask=None if t["attn_mask"] is None
                                else t["attn_mask"].detach().cpu())
    empty = (lse_nosink == -math.inf).to(out.device)                       # (B, H, Sq)
    assert empty.any(), "the case has no row without keys"
    rows = empty.transpose(1, 2)                                           # (B, Sq, H)
    assert (out[rows] == 0).all() and (got["dq"][rows] == 0).all()
    if var.sink:
        sink = t["sink"].detach().to(lse.dtype)
        assert torch.equal(lse[empty], sink[None, :, None].expand_as(lse)[empty])
    else:
        assert (lse[empty] == -math.inf).all()
    if "dmask" in got:
        full = got["dmask"].expand(cfg.b, cfg.h, cfg.sq, cfg.sk)
        if full.shape == got["dmask"].shape:
            assert (full[empty] == 0).all()
    got.update(out=out, lse=lse)
    ref = variant_reference(q, k, v, dout, cfg, var, t, keep=keep)
    check_variant_results(got, ref, dtype)


@pytest.mark.parametrize("var", [Var(mask="bool", mask_pattern="tiles"), Var(mask="add", mask_pattern="tiles"),
                                 Var(mask="add", mask_dims="1hqk", mask_pattern="tiles", sink=True, window=(200, 50))],
                         ids=lambda v: v.id)
@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_block_sparse_mask(device, dtype, var):
    """A mask whose 128 x 128 regions are empty, plain (True / 0) or random: whole kernel tiles are
    skipped or take the unmasked path (the binding's block flags), against the reference."""
    cfg = Cfg(2, 300, 400, 2, 1, 16, causal=True)
    t = make_variant_tensors(cfg, var, dtype, device)
    m = t["attn_mask"].detach().cpu()
    visible = m if m.dtype == torch.bool else m > -math.inf
    region = visible[..., :256, :256].unflatten(-1, (2, 128)).unflatten(-3, (2, 128))  # (.., 2, 128, 2, 128)
    counts = region.sum((-3, -1))
    assert (counts == 0).any() and (counts == 128 * 128).any() and ((counts > 0) & (counts < 128 * 128)).any()
    run_and_check(cfg, var, device, dtype, "flash")


@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_no_keys_at_all_with_sink(device, dtype):
    """seqlen_k = 0 with a sink: out 0, lse = sink, gradients 0 (also of the sink)."""
    q = torch.randn(2, 5, 4, 8, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 0, 2, 8, device=device, dtype=dtype, requires_grad=True)
    sink = torch.randn(4, device=device, dtype=expected_lse_dtype(dtype), requires_grad=True)
    out, lse = flashattn_ext.flash_attn_func(q, k, k, sink=sink, return_lse=True)
    assert (out == 0).all() and torch.equal(lse, sink.detach()[None, :, None].expand(2, 4, 5))
    dq, dsink = torch.autograd.grad(out, (q, sink), torch.randn_like(out))
    assert (dq == 0).all() and (dsink == 0).all()


@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_float_mask_rows_at_finfo_min(device, dtype, gqa):
    """Hugging Face pads with rows of a float mask entirely at torch.finfo(dtype).min: torch's math gives
    such a row uniform attention over its keys (score + min rounds to min), and so must we, out and the
    gradients of q, k, v and the mask; beside rows partly at min (a causal part at min, as Hugging Face's),
    padded keys, a row at -1e9 (score.h: also a huge entry on CUDA, except in fp64) and a row mixing min and
    ordinary entries. gqa: 4 query heads on 2 KV heads (enable_gqa). CUDA (issue 33): such entries are score.h's
    "huge" ones (exactly +-2^100 in the kernels' units, so that min x (1 / scale) cannot overflow); fp16 / bf16:
    the backward's preprocess scales dO of the rows whose maximum is one of them by 1 / l (rows.cu
    huge_row_fix); fp32 / fp64: that of every row with |lse| >= 1024 by 1 / its P's sum (simple.cu, as the
    CPU's renorm_rows), which the fp64 row at -1e9 (an ordinary entry there, its lse rounded at 2^-23) needs.
    Varlen batches take no attn_mask, so no varlen case here."""
    b, h, sq, sk, d = 2, 3, 40, 70, 16
    hq, hk = (4, 2) if gqa else (h, h)
    gen = torch.Generator().manual_seed(0)
    q, dout = (torch.randn(b, hq, sq, d, generator=gen, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(b, hk, sk, d, generator=gen, dtype=torch.float64) for _ in range(2))
    mask = torch.randn(b, 1, sq, sk, generator=gen, dtype=torch.float64)
    low = torch.finfo(dtype).min
    mask[0, 0, :5] = low  # whole rows
    mask[0, 0, 30] = -1e9 if dtype != torch.float16 else low  # a whole row at -1e9 (fp16: out of range)
    mask[0, 0, 31, ::2] = low  # half the keys at min: they get 0
    mask[0, 0, 32:, 60:] = low  # padded keys
    mask[1] = mask[1].masked_fill(~causal_mask(sq, sk, True), low)
    mask[1, 0, 17:20] = low

    def run(fn, dt, dev):
        leaves = [x.to(device=dev, dtype=dt).requires_grad_() for x in (q, k, v)]
        leaves.append(mask.clamp_min(low).to(device=dev, dtype=dt).requires_grad_())
        out = fn(*leaves[:3], attn_mask=leaves[3], enable_gqa=gqa)
        return [out] + list(torch.autograd.grad(out, leaves, dout.to(device=dev, dtype=dt)))

    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        ref = run(torch.nn.functional.scaled_dot_product_attention, dtype, "cpu")
        ref64 = run(torch.nn.functional.scaled_dot_product_attention, torch.float64, "cpu")
    got = run(flashattn_ext.scaled_dot_product_attention, dtype, device)
    for name, x, want, want64 in zip(("out", "dq", "dk", "dv", "dmask"), got, ref, ref64):
        # torch in dtype gives the semantics (the rounding of score + min), its float64 run the scale
        tol = OUT_TOL[dtype] if name == "out" else grad_tol(dtype)
        assert torch.isfinite(x).all(), name
        assert (x.double().cpu() - want.double()).norm() <= tol * want64.norm(), name


# ----------------------------------------------------------------------------------------------
# Sink and mask arguments
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_sink_alias_and_dtype(device, dtype):
    """s_aux is sink under transformers' name; a sink of another float dtype (bf16 / fp64) works and
    gets its gradient in its own dtype."""
    cfg = Cfg(2, 37, 53, 4, 2, 16, causal=True)
    var = Var(sink=True, window=(20, -1))
    q, k, v, dout = make_inputs(cfg, dtype, device)
    t = make_variant_tensors(cfg, var, dtype, device)
    out_sink = flashattn_ext.flash_attn_func(q, k, v, causal=True, window_size=var.window, sink=t["sink"])
    out_aux = flashattn_ext.flash_attn_func(q, k, v, causal=True, window_size=var.window, s_aux=t["sink"])
    assert torch.equal(out_sink, out_aux)
    for sink_dtype in (torch.bfloat16, torch.float64):
        sink = t["sink"].detach().to(sink_dtype).requires_grad_()
        out, lse = flashattn_ext.flash_attn_func(q, k, v, causal=True, window_size=var.window, sink=sink,
                                                 return_lse=True)
        dq, dsink = torch.autograd.grad(out, (q, sink), dout)
        assert dsink.dtype == sink_dtype and dsink.shape == sink.shape
        t2 = dict(t, sink=sink)
        ref = variant_reference(q, k, v, dout, cfg, var, t2)
        tol = max(grad_tol(dtype), 2.0 ** -8 if sink_dtype == torch.bfloat16 else 0.0)  # dsink rounded to bf16
        check_variant_results({"out": out, "lse": lse}, ref, dtype)
        assert_close("dq", dq, ref["dq"], grad_tol(dtype))
        assert_sum_close("dsink", dsink, ref["dsink"], ref["dsink_rw"], tol)


@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_mask_of_another_dtype_and_strides(device, dtype):
    """A floating mask of another dtype is cast (its gradient comes back in its dtype); a transposed
    (non-contiguous) mask is read through its strides; a mask that does not require grad gets none."""
    cfg = Cfg(2, 37, 53, 4, 2, 16)
    var = Var(mask="add", mask_dims="bhqk")
    q, k, v, dout = make_inputs(cfg, dtype, device)
    t = make_variant_tensors(cfg, var, dtype, device)
    other = torch.float32 if dtype == torch.float64 else torch.float64
    base = t["attn_mask"].detach()
    if dtype == torch.float64:  # values that survive the round trip through float32
        base = base.float().double()
    mask_t = base.transpose(-1, -2).contiguous().transpose(-1, -2).requires_grad_()      # strides (.., 1, sq)
    mask_o = base.to(other).requires_grad_()
    ref = variant_reference(q, k, v, dout, cfg, var, dict(t, attn_mask=mask_t))
    for mask in (mask_t, mask_o):
        out, lse = flashattn_ext.flash_attn_func(q, k, v, attn_mask=mask, return_lse=True)
        dq, dk, dv, dmask = torch.autograd.grad(out, (q, k, v, mask), dout)
        assert dmask.dtype == mask.dtype and dmask.shape == mask.shape
        got = dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv, dmask=dmask)
        # a float32 gradient of a float64 computation: float32's rounding
        fp32_grad = mask.dtype == torch.float32 and dtype == torch.float64
        factor = OUT_TOL[torch.float32] / grad_tol(dtype) if fp32_grad else 1.0
        check_variant_results(got, ref, dtype, grad_tol_factor=factor)
    out = flashattn_ext.flash_attn_func(q, k, v, attn_mask=base)  # a float mask without requires_grad
    assert_close("out", out, ref["out"], OUT_TOL[dtype])
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for name, g in zip(("dq", "dk", "dv"), grads):
        assert_close(name, g, ref[name], grad_tol(dtype))


# ----------------------------------------------------------------------------------------------
# gradcheck (float64)
# ----------------------------------------------------------------------------------------------

GRADCHECK_SHAPES = [Cfg(1, 5, 6, 2, 1, 3), Cfg(2, 6, 4, 2, 2, 2, causal=True, layout="bhsd")]
GRADCHECK_VARIANTS = [
    Var(window=(2, 1)), Var(window=(1, -1)), Var(softcap=0.8), Var(alibi="bh"), Var(sink=True),
    Var(mask="bool", mask_dims="b1qk"), Var(mask="add", mask_dims="1hqk"), Var(mask="add", mask_dims="qk"),
    Var(dropout=0.3), merge(Var(window=(2, 1)), Var(softcap=0.8), Var(alibi="h"), Var(sink=True),
                            Var(mask="add", mask_dims="b1qk"), Var(dropout=0.3)),
]


def variant_fn(cfg, var, tensors, api="flash", seed=DROPOUT_SEED):
    """out as a function of (q, k, v[, sink][, mask]) (the tensors of variant_grad_inputs); with a seed,
    torch.manual_seed(seed) before every call (gradcheck's repeated calls see one dropout mask)."""
    has_sink = tensors["sink"] is not None
    has_fmask = tensors["attn_mask"] is not None and tensors["attn_mask"].dtype != torch.bool

    def fn(q, k, v, *rest):
        rest = list(rest)
        t = dict(tensors)
        if has_sink:
            t["sink"] = rest.pop(0)
        if has_fmask:
            t["attn_mask"] = rest.pop(0)
        if seed is not None:
            torch.manual_seed(seed)
        if api == "flash":
            return run_flash(q, k, v, cfg, var, t)[0]
        return run_sdpa(q, k, v, cfg, var, t)
    return fn


@pytest.fixture
def one_thread():
    """gradcheck calls the kernels a few hundred times on tiny inputs: on one thread each call costs
    microseconds instead of milliseconds of thread wake-ups (the other tests run the threaded paths)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.mark.parametrize("cfg", GRADCHECK_SHAPES, ids=lambda c: c.id)
@pytest.mark.parametrize("var", GRADCHECK_VARIANTS, ids=lambda v: v.id)
@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_variant(device, var, cfg, one_thread):
    q, k, v, _ = make_inputs(cfg, torch.float64, device, requires_grad=False)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    t = make_variant_tensors(cfg, var, torch.float64, device)
    assert torch.autograd.gradcheck(variant_fn(cfg, var, t), tuple(variant_grad_inputs(*leaves, t)))


@pytest.mark.parametrize("var", [Var(mask="add", mask_dims="b1qk", dropout=0.3), Var(mask="bool", dropout=0.3)],
                         ids=lambda v: v.id)
@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_sdpa_variant(device, var, one_thread):
    cfg = Cfg(1, 5, 6, 2, 1, 3)
    q, k, v, _ = make_inputs(cfg, torch.float64, device, requires_grad=False)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    t = make_variant_tensors(cfg, var, torch.float64, device)
    assert torch.autograd.gradcheck(variant_fn(cfg, var, t, "sdpa"), tuple(variant_grad_inputs(*leaves, t)))


# ----------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True) and opcheck
# ----------------------------------------------------------------------------------------------

COMPILE_VARIANTS = list(FEATURES.values()) + [EVERYTHING]
COMPILE_CFG = Cfg(2, 37, 53, 4, 2, 16, causal=True, layout="bhsd")


@pytest.mark.parametrize("var", COMPILE_VARIANTS, ids=lambda v: v.id)
@pytest.mark.parametrize("device, dtype", device_dtype_params([("cpu", torch.float32), ("cuda", torch.bfloat16)]))
def test_compile_variant(device, dtype, var):
    """fullgraph aot_eager forward + backward of flash_attn_func with the variant (and SDPA where it
    takes it): compiled matches eager (same dropout seed) and the reference."""
    cfg = COMPILE_CFG
    q, k, v, dout = make_inputs(cfg, dtype, device)
    t = make_variant_tensors(cfg, var, dtype, device)
    inputs = variant_grad_inputs(q, k, v, t)
    names = variant_grad_names(t)
    apis = ["flash"] + (["sdpa"] if var.sdpa_ok and not (var.mask and cfg.causal) else [])
    for api in apis:
        fn = variant_fn(cfg, var, t, api, seed=None)
        torch._dynamo.reset()
        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
        compiled(*inputs)  # compiles
        torch.manual_seed(DROPOUT_SEED)
        c_out = compiled(*inputs)
        c_grads = torch.autograd.grad(c_out, inputs, dout)
        torch.manual_seed(DROPOUT_SEED)
        e_out = fn(*inputs)
        e_grads = torch.autograd.grad(e_out, inputs, dout)
        assert_close(f"{api} out (compiled vs eager)", c_out, e_out, OUT_TOL[dtype])
        for name, c, e in zip(names, c_grads, e_grads):
            assert_close(f"{api} {name} (compiled vs eager)", c, e, grad_tol(dtype))
        keep = replay_keep_mask(q, k, v, cfg, var, t, DROPOUT_SEED, bottom_right=api == "flash") if var.dropout \
            else None
        ref = variant_reference(q, k, v, dout, cfg, var, t, keep=keep, bottom_right=api == "flash")
        got = grads_dict(names, c_grads)
        got["out"] = c_out
        check_variant_results(got, ref, dtype)


@pytest.mark.parametrize("device, dtype", device_dtype_params([("cpu", torch.float32), ("cuda", torch.bfloat16)]))
def test_compile_dynamic_variant(device, dtype):
    """dynamic=True with window, sink and an additive mask: the fake kernels' shape checks hold for
    symbolic sizes; three sequence-length pairs through one compiled function."""
    var = Var(window=(7, 3), sink=True, mask="add", mask_dims="b1qk", softcap=2.0)
    torch._dynamo.reset()
    compiled = None
    for sq, sk in ((33, 47), (20, 61), (61, 20)):
        cfg = Cfg(2, sq, sk, 4, 2, 16, causal=True)
        q, k, v, dout = make_inputs(cfg, dtype, device)
        t = make_variant_tensors(cfg, var, dtype, device)
        fn = variant_fn(cfg, var, t, seed=None)
        if compiled is None:
            compiled = torch.compile(fn, fullgraph=True, backend="aot_eager", dynamic=True)
        inputs = variant_grad_inputs(q, k, v, t)
        out = compiled(*inputs)
        got = grads_dict(variant_grad_names(t), torch.autograd.grad(out, inputs, dout))
        got["out"] = out
        check_variant_results(got, variant_reference(q, k, v, dout, cfg, var, t), dtype)


OPCHECK_VARIANTS = list(FEATURES.values()) + [EVERYTHING]
OPCHECK_CFG = Cfg(2, 9, 21, 4, 2, 8, causal=True, layout="mixed")


@pytest.mark.parametrize("bottom_right", [True, False], ids=["bottom_right", "top_left"])
@pytest.mark.parametrize("var", OPCHECK_VARIANTS, ids=lambda v: v.id)
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_fwd_variant(device, var, bottom_right):
    cfg = OPCHECK_CFG
    q, k, v, _ = make_inputs(cfg, torch.float64, device)
    t = make_variant_tensors(cfg, var, torch.float64, device)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    torch.library.opcheck(torch.ops.flashattn_ext.fwd.default, op_fwd_args(*leaves, cfg, var, t, bottom_right))


@pytest.mark.parametrize("var", OPCHECK_VARIANTS, ids=lambda v: v.id)
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_bwd_variant(device, var):
    cfg = OPCHECK_CFG
    q, k, v, dout = make_inputs(cfg, torch.float64, device, requires_grad=False)
    t = make_variant_tensors(cfg, var, torch.float64, device, requires_grad=False)
    out, lse, rng_state, _ = torch.ops.flashattn_ext.fwd(*op_fwd_args(q, k, v, cfg, var, t))
    mask_grad = var.mask == "add"
    args = op_bwd_args(dout, q, k, v, out, lse, rng_state, cfg, var, t, mask_grad=mask_grad)
    torch.library.opcheck(torch.ops.flashattn_ext.bwd.default, args)
    dq, dk, dv, dmask, _ = torch.ops.flashattn_ext.bwd(*args)
    assert dmask.shape == ((cfg.b, cfg.h, cfg.sq, cfg.sk) if mask_grad else (0,))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_dropout_mask(device):
    q = torch.randn(2, 9, 4, 8, device=device)
    for rng_state in (torch.tensor([7, 0]), torch.tensor([-3, 2 ** 40 + 5])):
        torch.library.opcheck(torch.ops.flashattn_ext.dropout_mask.default, (q, rng_state, 21, 0.3))


# ----------------------------------------------------------------------------------------------
# Dropout: statistics, the Philox stream, forward/backward agreement, seeding
# ----------------------------------------------------------------------------------------------

STAT_SHAPE = (2, 256, 4, 512)  # (B, Sq, H, Sk): 2^20 elements


def within_sigmas(count, n, prob):
    """|count - n prob| <= SIGMAS * sqrt(n prob (1 - prob)): a binomial count within its bounds."""
    sigma = math.sqrt(n * prob * (1.0 - prob))
    return abs(count - n * prob) <= SIGMAS * sigma, f"{count} of {n}, expected {n * prob:.1f} +- {sigma:.1f}"


@pytest.mark.parametrize("p", [0.01, 0.1, 0.1234567, 0.17, 0.5, 0.9])
@pytest.mark.parametrize("device", DEVICES)
def test_dropout_keep_fraction(device, p):
    """The mean of the keep mask over 2^20 elements is 1 - p (the p passed, 0.1234567 included: no short
    binary expansion) within 5 sigma; so is the fraction of pairs of neighbours kept together ((1 - p)^2:
    the draws of two words of one Philox call and of two calls are independent); no two (batch, head)
    planes and no two rows are equal."""
    b, sq, h, sk = STAT_SHAPE
    q = torch.zeros(b, sq, h, 1, device=device)
    keep = torch.ops.flashattn_ext.dropout_mask(q, torch.tensor([2024, 77]), sk, p)
    assert keep.dtype == torch.bool and keep.shape == (b, h, sq, sk) and keep.device == q.device
    keep = keep.cpu()
    n = keep.numel()
    assert n >= 10 ** 6
    kp = 1.0 - p
    ok, msg = within_sigmas(int(keep.sum()), n, kp)
    assert ok, f"keep fraction: {msg}"
    for name, a, bb in (("same Philox call", keep[..., 0::2], keep[..., 1::2]),
                        ("across Philox calls", keep[..., 3:-1:4], keep[..., 4::4])):
        ok, msg = within_sigmas(int((a & bb).sum()), a.numel(), kp * kp)
        assert ok, f"neighbours kept together ({name}): {msg}"
    planes = keep.reshape(b * h, -1)
    assert all(not torch.equal(planes[i], planes[j]) for i in range(b * h) for j in range(i))
    rows = keep[0, 0]
    assert all(not torch.equal(rows[0], rows[i]) for i in range(1, sq))


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_mask_is_the_philox_stream(device):
    """dropout_mask equals, bit for bit, the stream documented in csrc/mask.h, computed here by an
    independent numpy Philox4x32-10 (checked against the published known-answer vectors), for seeds
    and offsets with high words set; so CPU and GPU masks are identical."""
    from fa_testing import philox4x32_10
    kat = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
           ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
           ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for ctr, key, want in kat:
        assert tuple(int(x) for x in philox4x32_10(ctr, key)) == want
    b, sq, h, sk = 2, 19, 3, 77
    q = torch.zeros(b, sq, h, 4, device=device)
    for seed, offset, p in ((0, 0, 0.3), (2 ** 63 - 25, 2 ** 35 + 3, 0.1), (-(2 ** 40) - 1, 12345, 0.77),
                            (5, 6, 0.1234567), (7, 8, 1e-12), (9, 10, 1.0 - 2.0 ** -34), (11, 12, 1.0)):
        got = torch.ops.flashattn_ext.dropout_mask(q, torch.tensor([seed, offset]), sk, p).cpu()
        assert torch.equal(got, philox_keep_mask(seed, offset, b, h, sq, sk, p)), (seed, offset, p)


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_threshold_extremes(device):
    """p = 1 and p >= 1 - 2^-33 (round(p 2^32) = 2^32) keep nothing; a p > 0 below 2^-33 still drops (the
    threshold is at least 1, so dropout stays on and kept values are scaled by 1 / (1 - p))."""
    q = torch.zeros(1, 64, 2, 1, device=device)
    rng_state = torch.tensor([3, 4])
    for p in (1.0, 1.0 - 2.0 ** -34):
        assert not torch.ops.flashattn_ext.dropout_mask(q, rng_state, 256, p).any(), p
    assert torch.ops.flashattn_ext.dropout_mask(q, rng_state, 256, 2.0 ** -40).all()


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_scale_is_one_over_one_minus_p(device):
    """float64 with p = 0.1234567: out and dv equal (P * keep / (1 - p)) @ v and its transpose product with
    the p passed (P and keep from S_dmask, P against the independent float64 probabilities) to ~1e-15;
    the former 16-bit rule (p rounded to a multiple of 2^-16) is 2.9e-6 away from it."""
    p = 0.1234567
    cfg = Cfg(2, 37, 83, 4, 2, 16)
    q, k, v, dout = make_inputs(cfg, torch.float64, device)
    var = Var(dropout=p)
    t = make_variant_tensors(cfg, var, torch.float64, device)
    torch.manual_seed(DROPOUT_SEED)
    out, _, s_dmask = run_flash(q, k, v, cfg, var, t, return_attn_probs=True)
    dv, = torch.autograd.grad(out, (v,), dout)
    keep = ~torch.signbit(s_dmask)
    probs = probs64(q, k, cfg, var, t).to(device)
    assert_close("|S_dmask|", s_dmask.abs(), probs, 1e-14)
    vh = v.detach().repeat_interleave(cfg.h // cfg.hkv, dim=2).transpose(1, 2)  # (B, H, Sk, D)
    dropped = probs * keep / (1.0 - p)
    out_ref = (dropped @ vh).transpose(1, 2)
    dv_ref = (dropped.transpose(-1, -2) @ dout.transpose(1, 2)).reshape(cfg.b, cfg.hkv, cfg.h // cfg.hkv, cfg.sk, -1)
    dv_ref = dv_ref.sum(2).transpose(1, 2)
    err = lambda got, ref: ((got - ref).abs().max() / ref.abs().max()).item()
    assert err(out, out_ref) < 1e-14, err(out, out_ref)
    assert err(dv, dv_ref) < 1e-14, err(dv, dv_ref)
    p16 = round(p * 65536) / 65536
    assert err((probs * keep / (1.0 - p16) @ vh).transpose(1, 2), out_ref) > 1e-6


@pytest.mark.parametrize("api", ["flash", "sdpa", "varlen"])
@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_dropout_p_one(device, dtype, api):
    """dropout_p = 1 keeps nothing, as torch: out 0 and every gradient 0 exactly (torch's SDPA gives the same),
    lse that of the call without dropout, S_dmask all negated; varlen: the batch's sequences end to end."""
    cfg = Cfg(2, 45, 70, 4, 2, 16, causal=True)
    var = Var(sink=api == "flash", dropout=1.0)
    q, k, v, dout = make_inputs(cfg, dtype, device)
    t = make_variant_tensors(cfg, var, dtype, device)
    inputs = variant_grad_inputs(q, k, v, t)
    if api == "flash":
        out, lse, s_dmask = run_flash(q, k, v, cfg, var, t, return_attn_probs=True)
        _, lse_ref = run_flash(q, k, v, cfg, dataclasses.replace(var, dropout=0.0), t)
        assert_close("lse", lse, lse_ref, 1e-6)  # on CUDA another kernel (HOOK) than without dropout
        assert torch.signbit(s_dmask).all()
    elif api == "varlen":
        cu_q = torch.arange(0, cfg.b + 1, dtype=torch.int32, device=device) * cfg.sq
        cu_k = torch.arange(0, cfg.b + 1, dtype=torch.int32, device=device) * cfg.sk
        out = flashattn_ext.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k, cfg.sq,
                                                   cfg.sk, dropout_p=1.0, softmax_scale=cfg.scale, causal=True)
        out = out.unflatten(0, (cfg.b, cfg.sq))
    else:
        out = run_sdpa(q, k, v, cfg, var, t)
        q64, k64, v64 = (x.detach().cpu().double().transpose(1, 2) for x in (q, k, v))
        torch_out = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, dropout_p=1.0, is_causal=True,
                                                                     scale=cfg.scale, enable_gqa=True)
        assert torch.equal(torch_out, torch.zeros_like(torch_out))  # torch's math: nothing kept
    assert torch.equal(out, torch.zeros_like(out))
    for name, g in zip(variant_grad_names(t), torch.autograd.grad(out, inputs, dout)):
        assert torch.equal(g, torch.zeros_like(g)), name


@requires_cuda
def test_dropout_mask_cpu_equals_cuda():
    rng_state = torch.tensor([99, 2 ** 33 + 1])
    q = torch.zeros(2, 130, 3, 8)
    a = torch.ops.flashattn_ext.dropout_mask(q, rng_state, 200, 0.25)
    b = torch.ops.flashattn_ext.dropout_mask(q.cuda(), rng_state, 200, 0.25).cpu()
    assert torch.equal(a, b)


def probs64(q, k, cfg, var, tensors, bottom_right=True):
    """The float64 probabilities (B, H, Sq, Sk) of attention64 (before dropout), read as its output
    for v = the identity over keys."""
    eye = torch.eye(cfg.sk, dtype=torch.float64)[None, :, None, :].expand(cfg.b, cfg.sk, cfg.hkv, cfg.sk)
    slopes, sink, mask = (tensors[n] for n in ("alibi_slopes", "sink", "attn_mask"))
    p, _ = attention64(q.detach().cpu(), k.detach().cpu(), eye, cfg.scale, cfg.causal, bottom_right,
                       window=var.window, softcap=var.softcap, alibi_slopes=None if slopes is None else slopes.cpu(),
                       sink=None if sink is None else sink.detach().cpu(),
                       attn_mask=None if mask is None else mask.detach().cpu())
    return p.permute(0, 2, 1, 3)


@pytest.mark.parametrize("var", [Var(dropout=0.2), merge(FEATURES["window"], FEATURES["sink"], FEATURES["mask_bool"],
                                                         Var(dropout=0.6), FEATURES["softcap"])], ids=lambda v: v.id)
@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_return_attn_probs(device, dtype, var):
    """return_attn_probs: S_dmask (B, H, Sq, Sk) in the lse dtype, |S_dmask| = P of the reference, its
    sign the keep mask of the call (= dropout_mask of the replayed rng_state; a dropped 0 is -0.0), and
    the gradient of that call's out matches the reference built from the sign (forward and backward
    see the same mask)."""
    cfg = Cfg(2, 45, 70, 4, 2, 16, causal=True)
    q, k, v, dout = make_inputs(cfg, dtype, device)
    t = make_variant_tensors(cfg, var, dtype, device)
    keep_replay = replay_keep_mask(q, k, v, cfg, var, t, DROPOUT_SEED)
    torch.manual_seed(DROPOUT_SEED)
    out, lse, s_dmask = run_flash(q, k, v, cfg, var, t, return_attn_probs=True)
    assert s_dmask.shape == (cfg.b, cfg.h, cfg.sq, cfg.sk) and s_dmask.dtype == expected_lse_dtype(dtype)
    keep = ~torch.signbit(s_dmask)
    assert torch.equal(keep, keep_replay)
    assert_close("|S_dmask|", s_dmask.abs(), probs64(q, k, cfg, var, t), OUT_TOL[dtype])
    names = variant_grad_names(t)
    got = grads_dict(names, torch.autograd.grad(out, variant_grad_inputs(q, k, v, t), dout))
    got.update(out=out, lse=lse)
    ref = variant_reference(q, k, v, dout, cfg, var, t, keep=keep)
    check_variant_results(got, ref, dtype)


@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_return_attn_probs_without_dropout(device, dtype):
    """Without dropout S_dmask is P, non-negative; the reference module's attention_probs agrees."""
    cfg = Cfg(1, 33, 20, 2, 1, 8, causal=True)
    var = Var(alibi="h", window=(6, 2))
    q, k, v, _ = make_inputs(cfg, dtype, device, requires_grad=False)
    t = make_variant_tensors(cfg, var, dtype, device)
    out, lse, s_dmask = run_flash(q, k, v, cfg, var, t, return_attn_probs=True)
    assert not torch.signbit(s_dmask).any()
    p_ref = probs64(q, k, cfg, var, t)
    assert_close("S_dmask", s_dmask, p_ref, OUT_TOL[dtype])
    assert_close("attention_probs", attention_probs(q.double(), k.double(), v.double(), causal=True,
                                                    window_size=var.window, alibi_slopes=t["alibi_slopes"]),
                 p_ref, 1e-12)


@pytest.mark.parametrize("api", ["flash", "sdpa"])
@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_dropout_seeding(device, dtype, api):
    """torch.manual_seed reproduces a dropout call bit for bit (out and gradients); another seed, or the
    next call without re-seeding, gives another mask (about 2 p (1 - p) of the entries differ)."""
    cfg = Cfg(2, 64, 96, 4, 2, 16, causal=True)
    var = Var(dropout=0.3)
    q, k, v, dout = make_inputs(cfg, dtype, device)
    t = make_variant_tensors(cfg, var, dtype, device)
    run = run_flash if api == "flash" else (lambda *a: (run_sdpa(*a), None))

    def call(seed=None):
        if seed is not None:
            torch.manual_seed(seed)
        out = run(q, k, v, cfg, var, t)[0]
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    first, again = call(11), call(11)
    for name, a, b in zip(("out", "dq", "dk", "dv"), first, again):
        assert torch.equal(a, b), f"{name} differs between two calls with the same seed"
    other, following = call(12), call()
    for name, x in (("another seed", other), ("the next call", following)):
        assert not torch.equal(first[0], x[0]), f"{name} gave the same output"
    masks = [replay_keep_mask(q, k, v, cfg, var, t, s, bottom_right=api == "flash") for s in (11, 12)]
    n = masks[0].numel()
    kp = keep_probability(var.dropout)
    ok, msg = within_sigmas(int((masks[0] != masks[1]).sum()), n, 2 * kp * (1 - kp))
    assert ok, f"masks of two seeds: {msg}"


def test_dropout_rng_state_follows_the_generator():
    """The fwd op draws (seed, offset) from torch's default generator: the same seed gives the same
    rng_state, another seed or the next call another; without dropout the generator is not consumed."""
    cfg = Cfg(1, 8, 8, 2, 2, 8)
    q, k, v, _ = make_inputs(cfg, torch.float32, "cpu", requires_grad=False)
    var = Var(dropout=0.1)
    args = op_fwd_args(q, k, v, cfg, var, make_variant_tensors(cfg, var, torch.float32, "cpu"))
    states = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        states.append(torch.ops.flashattn_ext.fwd(*args)[2])
    nxt = torch.ops.flashattn_ext.fwd(*args)[2]
    assert torch.equal(states[0], states[1])
    assert not torch.equal(states[0], states[2]) and not torch.equal(states[2], nxt)
    torch.manual_seed(5)
    before = torch.get_rng_state()
    torch.ops.flashattn_ext.fwd(*op_fwd_args(q, k, v, cfg, Var(), {}))
    assert torch.equal(before, torch.get_rng_state())


@pytest.mark.parametrize("device", DEVICES)
def test_reference_module_variants(device):
    """flashattn_ext.reference.attention_ref (float64) with every variant at once against attention64:
    out, lse and the gradients of q, k, v, the sink and the mask."""
    for cfg in SHAPES:
        var = EVERYTHING
        q, k, v, dout = make_inputs(cfg, torch.float64, device)
        t = make_variant_tensors(cfg, var, torch.float64, device)
        keep = torch.rand(cfg.b, cfg.h, cfg.sq, cfg.sk, device=device) < keep_probability(var.dropout)
        out, lse = attention_ref(q, k, v, cfg.scale, cfg.causal, True, var.window, var.softcap, t["alibi_slopes"],
                                 t["sink"], t["attn_mask"], var.dropout, keep)
        names = variant_grad_names(t)
        got = grads_dict(names, torch.autograd.grad(out, variant_grad_inputs(q, k, v, t), dout))
        got.update(out=out, lse=lse)
        ref = variant_reference(q, k, v, dout, cfg, var, t, keep=keep)
        check_variant_results(got, ref, torch.float64)
