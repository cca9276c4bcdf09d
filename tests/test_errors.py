"""Every bad input raises, with a message naming the argument. C++ checks (TORCH_CHECK) surface as
RuntimeError; the Python functions raise ValueError (a bad value) or TypeError (a bad type)."""
import math

import numpy as np
import pytest
import torch

import flashattn_ext
from fa_testing import KVCACHE_FWD_ARGS, VARLEN_BWD_ARGS, VARLEN_FWD_ARGS, op_kwargs, varlen_fwd_op
from fa_testing import DEVICES, requires_cuda

fwd_op = torch.ops.flashattn_ext.fwd
bwd_op = torch.ops.flashattn_ext.bwd


def mentions(*words):
    """A regex that matches when every word occurs in the message (any order, case-insensitive)."""
    return "(?is)^" + "".join(f"(?=.*{w})" for w in words)


def qkv(device="cpu", dtype=torch.float32, b=2, sq=5, sk=7, h=4, hkv=2, d=8):
    return (torch.randn(b, sq, h, d, device=device, dtype=dtype),
            torch.randn(b, sk, hkv, d, device=device, dtype=dtype),
            torch.randn(b, sk, hkv, d, device=device, dtype=dtype))


def fwd_args(q, k, v, window=(-1, -1), softcap=0.0, alibi_slopes=None, sink=None, attn_mask=None, dropout_p=0.0):
    """Positional arguments of the fwd op (scale 0.5, not causal, bottom-right)."""
    return (q, k, v, 0.5, False, True, window[0], window[1], softcap, alibi_slopes, sink, attn_mask, dropout_p, False)


def through_both(fn_args):
    """Runs the bad inputs through the op and through flash_attn_func."""
    q, k, v = fn_args
    return [lambda: fwd_op(*fwd_args(q, k, v)),
            lambda: flashattn_ext.flash_attn_func(q, k, v)]


def assert_raises_both(q, k, v, exc, pattern, py_exc=None):
    """The op raises exc, flash_attn_func py_exc (default: exc)."""
    op_call, py_call = through_both((q, k, v))
    with pytest.raises(exc, match=pattern):
        op_call()
    with pytest.raises(py_exc or exc, match=pattern):
        py_call()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["k", "v"])
def test_dtype_mismatch(device, which):
    q, k, v = qkv(device)
    if which == "k":
        k = k.double()
    else:
        v = v.double()
    assert_raises_both(q, k, v, RuntimeError, mentions(r"\bq\b", r"\bk\b", r"\bv\b", "dtype"))


@pytest.mark.parametrize("device", DEVICES)
def test_int32_rejected(device):
    q, k, v = (t.to(torch.int32) for t in qkv(device))
    assert_raises_both(q, k, v, RuntimeError, mentions(r"\bq\b", "float32", "Int"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_wrong_ndim(device, which):
    q, k, v = qkv(device)
    bad = {"q": q, "k": k, "v": v}
    bad[which] = bad[which][0]  # 3-D
    # flash_attn_func reads q's shape itself, so it checks q's rank first (ValueError)
    assert_raises_both(bad["q"], bad["k"], bad["v"], RuntimeError, mentions(rf"\b{which}\b", "4 dimensions"),
                       py_exc=ValueError if which == "q" else RuntimeError)


@pytest.mark.parametrize("device", DEVICES)
def test_batch_mismatch(device):
    q, _, _ = qkv(device)
    _, k, v = qkv(device, b=3)
    assert_raises_both(q, k, v, RuntimeError, mentions("batch"))


@pytest.mark.parametrize("device", DEVICES)
def test_head_dim_mismatch(device):
    """q and k must share a head dim (v has its own: tests/test_headdim_v.py)."""
    q, _, _ = qkv(device, d=8)
    _, k, v = qkv(device, d=16)
    assert_raises_both(q, k, v, RuntimeError, mentions("head ?dim", r"\bq\b", r"\bk\b"))
    q, _, v = qkv(device, d=8)
    _, k, _ = qkv(device, d=16)
    assert_raises_both(q, k, v, RuntimeError, mentions("head ?dim", r"\bq\b", r"\bk\b"))


@pytest.mark.parametrize("device", DEVICES)
def test_seqlen_k_v_mismatch(device):
    q, k, _ = qkv(device, sk=7)
    _, _, v = qkv(device, sk=6)
    assert_raises_both(q, k, v, RuntimeError, mentions("seqlen", r"\bk\b", r"\bv\b"))


@pytest.mark.parametrize("device", DEVICES)
def test_nheads_not_a_multiple(device):
    q, k, v = qkv(device, h=6, hkv=4)
    assert_raises_both(q, k, v, RuntimeError, mentions("nheads", "multiple"))


@pytest.mark.parametrize("device", DEVICES)
def test_nheads_k_v_mismatch(device):
    q, k, _ = qkv(device, h=4, hkv=2)
    _, _, v = qkv(device, h=4, hkv=4)
    assert_raises_both(q, k, v, RuntimeError, mentions("nheads", r"\bk\b", r"\bv\b"))


@requires_cuda
@pytest.mark.parametrize("which", ["k", "v"])
def test_different_devices(which):
    q, k, v = qkv("cuda")
    if which == "k":
        k = k.cpu()
    else:
        v = v.cpu()
    assert_raises_both(q, k, v, RuntimeError, mentions("device"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_last_dim_stride(device, which):
    """The op takes any strides but requires the last one to be 1 (it never copies)."""
    q, k, v = qkv(device)
    bad = {"q": q, "k": k, "v": v}
    t = bad[which]
    bad[which] = torch.randn(*t.shape[:-1], 2 * t.shape[-1], device=device)[..., ::2]
    assert bad[which].stride(-1) == 2
    assert_raises_both(bad["q"], bad["k"], bad["v"], RuntimeError, mentions(rf"\b{which}\b", "stride"))


def sdpa_inputs(h=4, hkv=4):
    q, k, v = qkv(h=h, hkv=hkv)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def test_sdpa_gqa_needs_enable_gqa():
    q, k, v = sdpa_inputs(h=4, hkv=2)
    with pytest.raises((ValueError, RuntimeError), match=mentions("enable_gqa")):
        flashattn_ext.scaled_dot_product_attention(q, k, v)
    out = flashattn_ext.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert out.shape == q.shape


def test_sdpa_wrong_ndim():
    q, k, v = sdpa_inputs()
    with pytest.raises((ValueError, RuntimeError), match=mentions("key", "2 dimensions")):
        flashattn_ext.scaled_dot_product_attention(q, k[0, 0, 0], v)


@pytest.mark.parametrize("device", DEVICES)
def test_bwd_op_checks(device):
    """The backward op validates what it did not compute itself: dout, out and lse."""
    q, k, v = qkv(device)
    out, lse, rng_state, _ = fwd_op(*fwd_args(q, k, v))
    dout = torch.randn_like(out)
    rest = (0.5, False, True, -1, -1, 0.0, None, None, None, 0.0, False, False)
    args = lambda **kw: [kw.get(n, x) for n, x in  # noqa: E731
                         (("dout", dout), ("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse),
                          ("rng_state", rng_state))]
    bwd_op(*args(), *rest)  # the good call works
    bad_cases = [
        (dict(dout=dout[:, :-1]), "dout"),
        (dict(dout=dout.double()), "dout"),
        (dict(out=out[:, :, :-1]), r"\bout\b"),
        (dict(lse=lse[:, :-1]), "lse"),
        (dict(lse=lse.double()), "lse"),
        (dict(q=q[..., :4]), "head ?dim"),
        (dict(rng_state=rng_state.int()), "rng_state"),
        (dict(rng_state=torch.zeros(3, dtype=torch.int64)), "rng_state"),
    ]
    for kw, name in bad_cases:
        with pytest.raises(RuntimeError, match=mentions(name)):
            bwd_op(*args(**kw), *rest)
    # mask_grad needs a floating attn_mask
    for mask in (None, torch.ones(2, 4, 5, 7, dtype=torch.bool, device=device)):
        with pytest.raises(RuntimeError, match=mentions("mask_grad")):
            bwd_op(*args(), 0.5, False, True, -1, -1, 0.0, None, None, mask, 0.0, False, True)


# ----------------------------------------------------------------------------------------------
# The variants' arguments
# ----------------------------------------------------------------------------------------------

PY_ERRORS = (ValueError, TypeError)
# A device that is not the inputs' without a second real one, for the Python checks (the op itself would
# dispatch to its fake kernel on a meta argument: its device checks are tested on CUDA).
OTHER_DEVICE = "meta"


def variant_calls(**kw):
    """flash_attn_func and the fwd op on good q, k, v (b 2, sq 5, sk 7, h 4, hkv 2) with the variant
    arguments kw (flash_attn_func's names); returns (python call, op call)."""
    q, k, v = qkv()
    window = kw.get("window_size", (-1, -1))

    def python():
        return flashattn_ext.flash_attn_func(q, k, v, **kw)

    def op():
        return fwd_op(*fwd_args(q, k, v, window, kw.get("softcap", 0.0), kw.get("alibi_slopes"), kw.get("sink"),
                                kw.get("attn_mask"), kw.get("dropout_p", 0.0)))
    return python, op


def assert_both_raise(name, kw, op_too=True, py_exc=PY_ERRORS):
    python, op = variant_calls(**kw)
    with pytest.raises(py_exc, match=mentions(name)):
        python()
    if op_too:
        with pytest.raises(RuntimeError, match=mentions(name)):
            op()


@pytest.mark.parametrize("window", [(-2, 0), (0, -2), (-5, -5), (-2, -1)], ids=str)
def test_window_below_minus_one(window):
    assert_both_raise("window", dict(window_size=window), py_exc=ValueError)


@pytest.mark.parametrize("window", [(1.5, 2), (3,), 4, (1, 2, 3), (True, 1)], ids=str)
def test_window_not_a_pair_of_ints(window):
    python, _ = variant_calls(window_size=window)
    with pytest.raises(TypeError, match=mentions("window_size")):
        python()


@pytest.mark.parametrize("softcap", [-1.0, -1e-9, math.inf, math.nan], ids=str)
def test_softcap_negative_or_not_finite(softcap):
    assert_both_raise("softcap", dict(softcap=softcap), py_exc=ValueError)


@pytest.mark.parametrize("shape", [(5,), (2, 4, 1), (3, 4), (1, 4), (4, 2), ()], ids=str)
def test_alibi_slopes_shape(shape):
    """(nheads,) = (4,) or (batch, nheads) = (2, 4) only."""
    assert_both_raise("alibi_slopes", dict(alibi_slopes=torch.ones(shape)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16, torch.int32], ids=str)
def test_alibi_slopes_dtype(dtype):
    assert_both_raise("alibi_slopes", dict(alibi_slopes=torch.ones(4, dtype=dtype)))


def test_alibi_slopes_device():
    assert_both_raise("alibi_slopes", dict(alibi_slopes=torch.ones(4, device=OTHER_DEVICE)), op_too=False)


@requires_cuda
@pytest.mark.parametrize("name", ["alibi_slopes", "sink", "attn_mask"])
def test_variant_tensor_on_cpu_for_cuda_inputs(name):
    q, k, v = qkv("cuda")
    t = {"alibi_slopes": torch.ones(4), "sink": torch.zeros(4), "attn_mask": torch.zeros(MASK_SHAPE)}[name]
    with pytest.raises(PY_ERRORS, match=mentions(name, "device")):
        flashattn_ext.flash_attn_func(q, k, v, **{name: t})
    with pytest.raises(RuntimeError, match=mentions(name, "device")):
        fwd_op(*fwd_args(q, k, v, **{name: t}))


def test_alibi_slopes_not_a_tensor():
    python, _ = variant_calls(alibi_slopes=[1.0, 1.0, 1.0, 1.0])
    with pytest.raises(TypeError, match=mentions("alibi_slopes")):
        python()


@pytest.mark.parametrize("shape", [(5,), (2,), (1, 4), (2, 4), ()], ids=str)
def test_sink_shape(shape):
    """(nheads,) = (4,) only; (2,) is nheads_kv."""
    for name in ("sink", "s_aux"):
        python, _ = variant_calls(**{name: torch.zeros(shape)})
        with pytest.raises(ValueError, match=mentions("sink")):
            python()
    _, op = variant_calls(sink=torch.zeros(shape))
    with pytest.raises(RuntimeError, match=mentions("sink")):
        op()


def test_sink_dtype_and_device():
    for sink in (torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.bool)):
        python, op = variant_calls(sink=sink)
        with pytest.raises(TypeError, match=mentions("sink")):
            python()
        with pytest.raises(RuntimeError, match=mentions("sink")):
            op()
    # the op takes the sink in the lse dtype only (flash_attn_func casts any float dtype)
    _, op = variant_calls(sink=torch.zeros(4, dtype=torch.float64))
    with pytest.raises(RuntimeError, match=mentions("sink", "dtype")):
        op()
    assert_both_raise("sink", dict(sink=torch.zeros(4, device=OTHER_DEVICE)), op_too=False)


def test_sink_and_s_aux_together():
    python, _ = variant_calls(sink=torch.zeros(4), s_aux=torch.zeros(4))
    with pytest.raises(ValueError, match=mentions("sink", "s_aux")):
        python()


MASK_SHAPE = (2, 4, 5, 7)  # (batch, nheads, seqlen_q, seqlen_k) of qkv()


def mask_calls(mask):
    """flash_attn_func and SDPA on the inputs of qkv() with attn_mask=mask."""
    q, k, v = qkv(h=4, hkv=4)
    return [lambda: flashattn_ext.flash_attn_func(q, k, v, attn_mask=mask),
            lambda: flashattn_ext.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                               v.transpose(1, 2), attn_mask=mask)]


@pytest.mark.parametrize("shape", [(6, 7), (5, 8), (2, 4, 5, 8), (3, 1, 5, 7), (5, 5, 7), (1, 2, 4, 5, 7), (7, 5)],
                         ids=str)
@pytest.mark.parametrize("dtype", [torch.bool, torch.float32], ids=["bool", "float"])
def test_attn_mask_shape_does_not_broadcast(shape, dtype):
    for call in mask_calls(torch.zeros(shape, dtype=dtype)):
        with pytest.raises(ValueError, match=mentions("attn_mask")):
            call()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.int8], ids=str)
def test_attn_mask_dtype(dtype):
    for call in mask_calls(torch.zeros(MASK_SHAPE, dtype=dtype)):
        with pytest.raises(PY_ERRORS, match=mentions("attn_mask")):
            call()


def test_attn_mask_device():
    for call in mask_calls(torch.zeros(MASK_SHAPE, device=OTHER_DEVICE)):
        with pytest.raises(PY_ERRORS, match=mentions("attn_mask", "device")):
            call()


def test_attn_mask_checks_of_the_op():
    """The op takes the (B, H, Sq, Sk) expanded mask, bool or in q's dtype, on q's device."""
    q, k, v = qkv()
    bad = [(torch.zeros(5, 7), "shape"), (torch.zeros(2, 4, 5, 6), "shape"),
           (torch.zeros(MASK_SHAPE, dtype=torch.float64), "dtype"),
           (torch.zeros(MASK_SHAPE, dtype=torch.int32), "dtype")]
    for mask, what in bad:
        with pytest.raises(RuntimeError, match=mentions("attn_mask", what)):
            fwd_op(*fwd_args(q, k, v, attn_mask=mask))


def test_attn_mask_with_is_causal():
    q, k, v = sdpa_inputs()
    for mask in (torch.ones(5, 7, dtype=torch.bool), torch.zeros(5, 7)):
        with pytest.raises(ValueError, match=mentions("attn_mask", "is_causal")):
            flashattn_ext.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)


@pytest.mark.parametrize("p", [-0.1, -1e-12, 1.0 + 2.0 ** -52, 1.5, math.nan, math.inf], ids=str)
def test_dropout_p_outside_unit_interval(p):
    assert_both_raise("dropout_p", dict(dropout_p=p), py_exc=ValueError)
    q, k, v = sdpa_inputs()
    with pytest.raises(ValueError, match=mentions("dropout_p")):
        flashattn_ext.scaled_dot_product_attention(q, k, v, dropout_p=p)
    with pytest.raises(RuntimeError, match=mentions("dropout_p")):
        torch.ops.flashattn_ext.dropout_mask(q, torch.tensor([1, 2]), 7, p)


def test_dropout_p_not_a_number():
    for p in ("0.1", None, True):
        python, _ = variant_calls(dropout_p=p)
        with pytest.raises(TypeError, match=mentions("dropout_p")):
            python()


def test_dropout_mask_op_checks():
    q = torch.zeros(2, 5, 4, 8)
    for rng_state in (torch.tensor([1, 2], dtype=torch.int32), torch.tensor([1, 2, 3]), torch.tensor([[1, 2]])):
        with pytest.raises(RuntimeError, match=mentions("rng_state")):
            torch.ops.flashattn_ext.dropout_mask(q, rng_state, 7, 0.1)
    with pytest.raises(RuntimeError, match=mentions("seqlen_k")):
        torch.ops.flashattn_ext.dropout_mask(q, torch.tensor([1, 2]), -1, 0.1)
    with pytest.raises(RuntimeError, match=mentions(r"\bq\b", "4 dimensions")):
        torch.ops.flashattn_ext.dropout_mask(q[0], torch.tensor([1, 2]), 7, 0.1)



# ----------------------------------------------------------------------------------------------
# Meta tensors beside real ones: the op dispatches to its fake kernel, which raises instead of returning
# uninitialised memory; every argument on meta (tracing) still works.
# ----------------------------------------------------------------------------------------------

def op_calls():
    """(op, {argument name: value}) of valid CPU calls of every op, with every optional tensor given."""
    q, k, v = qkv()
    alibi, sink, mask = torch.rand(4) * 0.5, torch.zeros(4), torch.zeros(MASK_SHAPE)
    fwd = fwd_args(q, k, v, alibi_slopes=alibi, sink=sink, attn_mask=mask)
    out, lse, rng_state, _ = fwd_op(*fwd)
    bwd = (torch.randn_like(out), q, k, v, out, lse, rng_state) + fwd[3:] + (True,)
    vq, vk, vv = q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)  # 2 sequences of 5 queries, 7 keys
    cu_q, cu_k = torch.tensor([0, 5, 10], dtype=torch.int32), torch.tensor([0, 7, 14], dtype=torch.int32)
    used = torch.tensor([7, 6], dtype=torch.int32)
    varlen = (vq, vk, vv, cu_q, cu_k, used, 5, 7, 0.5, True, -1, -1, 0.0, alibi, sink, 0.0, False)
    v_out, v_lse, v_rng, _ = varlen_fwd_op(*varlen)
    pages, table = torch.randn(3, 16, 2, 8), torch.tensor([[0, 2], [1, 0]], dtype=torch.int32)
    paged = (vq, pages, pages.clone()) + varlen[3:] + (table,)
    varlen_bwd = (torch.randn_like(v_out), vq, vk, vv, v_out, v_lse, v_rng) + varlen[3:]
    idx = torch.tensor([1, 0], dtype=torch.int32)
    kvcache = (q, torch.randn(2, 9, 2, 8), torch.randn(2, 9, 2, 8), used, idx, idx, None, 0.5, True, -1, -1, 0.0,
               alibi, sink, 0)
    kvcache_paged = (q, pages, pages.clone(), used, None, idx, table) + kvcache[7:]
    dropout_op = torch.ops.flashattn_ext.dropout_mask

    def named(op):
        return [a.name for a in op.default._schema.arguments]

    calls = [(fwd_op, named(fwd_op), fwd), (bwd_op, named(bwd_op), bwd),
             (dropout_op, named(dropout_op), (q, rng_state, 7, 0.1)),
             (fwd_op, VARLEN_FWD_ARGS, varlen), (fwd_op, VARLEN_FWD_ARGS, paged),
             (bwd_op, VARLEN_BWD_ARGS, varlen_bwd), (fwd_op, KVCACHE_FWD_ARGS, kvcache),
             (fwd_op, KVCACHE_FWD_ARGS, kvcache_paged)]
    return [(op, op_kwargs(names, args)) for op, names, args in calls]


OP_CALL_IDS = ["fwd", "bwd", "dropout_mask", "varlen_fwd", "varlen_fwd_paged", "varlen_bwd", "kvcache_fwd",
               "kvcache_fwd_paged"]


@pytest.mark.parametrize("index", range(len(OP_CALL_IDS)), ids=OP_CALL_IDS)
def test_meta_tensor_beside_cpu_ones(index):
    op, args = op_calls()[index]
    tensors = [n for n, t in args.items() if isinstance(t, torch.Tensor)]
    for name in tensors:
        call = lambda: op(**{**args, name: args[name].to("meta")})  # noqa: E731
        if set(tensors) - {name} == {"rng_state"}:  # dropout_mask(meta q, CPU rng_state): a trace, it works
            assert call().device.type == "meta"
            continue
        with pytest.raises(RuntimeError, match=mentions(rf"\b{name}\b", "device", "meta")):
            call()


@pytest.mark.parametrize("index", range(len(OP_CALL_IDS)), ids=OP_CALL_IDS)
def test_all_meta_call_works(index):
    """Every tensor argument on meta: the fake kernel runs and gives the CPU call's shapes and dtypes."""
    op, args = op_calls()[index]
    real = op(**args)
    fake = op(**{n: t.to("meta") if isinstance(t, torch.Tensor) else t for n, t in args.items()})
    real, fake = (r if isinstance(r, tuple) else (r,) for r in (real, fake))
    assert [(r.shape, r.dtype) for r in real] == [(f.shape, f.dtype) for f in fake]
    assert all(f.device.type in ("meta", "cpu") for f in fake)  # rng_state is a CPU tensor


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_meta_tensor_through_the_public_functions(which):
    """The op's check (RuntimeError) or the function's own (ValueError, an index tensor on another device)."""
    tensors = dict(zip("qkv", qkv(h=4, hkv=4)))
    tensors[which] = tensors[which].to("meta")
    cu = torch.tensor([0, 5, 10], dtype=torch.int32)
    for call in (lambda: flashattn_ext.flash_attn_func(**tensors),
                 lambda: flashattn_ext.scaled_dot_product_attention(*(tensors[n].transpose(1, 2) for n in "qkv")),
                 lambda: flashattn_ext.flash_attn_varlen_func(*(tensors[n].flatten(0, 1) for n in "qkv"), cu, cu, 5,
                                                              5)):
        with pytest.raises((RuntimeError, ValueError), match=mentions("device", "meta")):
            call()


# ----------------------------------------------------------------------------------------------
# Argument types of every public function: flags are bools, scales / dropout_p / softcap real numbers,
# window_size a pair of ints; messages name the function and the argument.
# ----------------------------------------------------------------------------------------------

def public_calls():
    """{function name: call(**kw)} on small valid inputs; kw are the function's own keyword arguments."""
    q, k, v = qkv(h=4, hkv=4)
    cu = torch.tensor([0, 5, 10], dtype=torch.int32)
    vq, vk, vv = q.flatten(0, 1), k[:, :5].flatten(0, 1), v[:, :5].flatten(0, 1)
    k_cache, v_cache = torch.randn(2, 9, 4, 8), torch.randn(2, 9, 4, 8)
    seqlens = torch.tensor([2, 4], dtype=torch.int32)
    f = flashattn_ext
    return {
        "flash_attn_func": lambda **kw: f.flash_attn_func(q, k, v, **kw),
        "scaled_dot_product_attention": lambda **kw: f.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **kw),
        "flash_attn_varlen_func": lambda **kw: f.flash_attn_varlen_func(vq, vk, vv, cu, cu, 5, 5, **kw),
        "flash_attn_varlen_qkvpacked_func": lambda **kw: f.flash_attn_varlen_qkvpacked_func(
            torch.stack((vq, vk, vv), 1), cu, 5, **kw),
        "flash_attn_varlen_kvpacked_func": lambda **kw: f.flash_attn_varlen_kvpacked_func(
            vq, torch.stack((vk, vv), 1), cu, cu, 5, 5, **kw),
        "flash_attn_with_kvcache": lambda **kw: f.flash_attn_with_kvcache(
            q[:, :1], k_cache, v_cache, k[:, :2], v[:, :2], cache_seqlens=seqlens, **kw),
        # bad arguments only: they raise before any process group is needed
        "ring_attention": lambda **kw: f.distributed.ring_attention(q, k[:, :5], v[:, :5], **kw),
    }


FLAGS = {
    "flash_attn_func": ["causal", "deterministic", "return_attn_probs", "return_lse"],
    "scaled_dot_product_attention": ["is_causal", "enable_gqa"],
    "flash_attn_varlen_func": ["causal", "deterministic", "return_attn_probs", "return_lse"],
    "flash_attn_varlen_qkvpacked_func": ["causal", "deterministic", "return_lse"],
    "flash_attn_varlen_kvpacked_func": ["causal", "deterministic", "return_lse"],
    "flash_attn_with_kvcache": ["causal", "rotary_interleaved", "return_softmax_lse", "check_cache_seqlens"],
    "ring_attention": ["causal", "deterministic", "return_lse"],
}
NOT_BOOLS = ["yes", "", 1, 0, None, 1.0, torch.tensor(True)]


@pytest.mark.parametrize("fn, name", [(fn, n) for fn, names in FLAGS.items() for n in names], ids=str)
def test_flags_must_be_bools(fn, name):
    """causal="yes" was taken as True; now every flag is a bool as torch's own (is_causal=1 raises there)."""
    call = public_calls()[fn]
    for bad in NOT_BOOLS:
        with pytest.raises(TypeError, match=mentions(fn, name, "bool")):
            call(**{name: bad})


SCALES = {
    "flash_attn_func": "softmax_scale", "scaled_dot_product_attention": "scale",
    "flash_attn_varlen_func": "softmax_scale", "flash_attn_varlen_qkvpacked_func": "softmax_scale",
    "flash_attn_with_kvcache": "softmax_scale", "ring_attention": "softmax_scale",
}
NOT_REALS = ["0.5", True, torch.tensor(0.5), [0.5], 0.5j]


@pytest.mark.parametrize("fn", list(SCALES), ids=str)
def test_scale_must_be_a_finite_real(fn):
    """A real number (a bool or a tensor would be misused: a tensor's gradient would be lost, a CUDA one read
    with a synchronization); ints and NumPy scalars are taken as floats, giving the float's result."""
    call, name = public_calls()[fn], SCALES[fn]
    for bad in NOT_REALS:
        with pytest.raises(TypeError, match=mentions(fn, name, "float")):
            call(**{name: bad})
    for bad in (math.inf, -math.inf, math.nan):
        with pytest.raises(ValueError, match=mentions(fn, name, "finite")):
            call(**{name: bad})
    if fn == "ring_attention":
        return
    first = lambda r: r[0] if isinstance(r, tuple) else r  # noqa: E731
    want = first(call(**{name: 1.0}))
    for same in (1, np.float32(1.0), np.int64(1)):
        assert torch.equal(first(call(**{name: same})), want)


DROPOUTS = ["flash_attn_func", "scaled_dot_product_attention", "flash_attn_varlen_func",
            "flash_attn_varlen_kvpacked_func"]
SOFTCAPS = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"]
WINDOWS = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache"]


@pytest.mark.parametrize("fn, arg", [(fn, "dropout_p") for fn in DROPOUTS] + [(fn, "softcap") for fn in SOFTCAPS],
                         ids=str)
def test_real_argument_type(fn, arg):
    call = public_calls()[fn]
    for bad in NOT_REALS:
        with pytest.raises(TypeError, match=mentions(fn, arg, "float")):
            call(**{arg: bad})


@pytest.mark.parametrize("fn", WINDOWS, ids=str)
def test_window_size_type(fn):
    call = public_calls()[fn]
    for bad in ((1.5, 2), (3,), 4, "ab", (True, 1), (1, None)):
        with pytest.raises(TypeError, match=mentions(fn, "window_size")):
            call(window_size=bad)


def test_kvcache_bad_types_change_nothing():
    """flash_attn_with_kvcache's type errors come before the append: the caches keep their contents."""
    q, k_cache, v_cache = torch.randn(2, 1, 4, 8), torch.randn(2, 9, 4, 8), torch.randn(2, 9, 4, 8)
    before = k_cache.clone(), v_cache.clone()
    new, seqlens = torch.randn(2, 1, 4, 8), torch.tensor([2, 4], dtype=torch.int32)
    for kw in (dict(causal="yes"), dict(rotary_interleaved=1), dict(softmax_scale="1"), dict(softcap=True),
               dict(window_size=(1.5, 0)), dict(check_cache_seqlens=None)):
        with pytest.raises(TypeError, match=mentions("flash_attn_with_kvcache")):
            flashattn_ext.flash_attn_with_kvcache(q, k_cache, v_cache, new, new, cache_seqlens=seqlens, **kw)
        assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])


def test_modules_check_their_arguments():
    with pytest.raises(TypeError, match=mentions("Attention", "causal", "bool")):
        flashattn_ext.nn.Attention(32, 4, causal="yes")
    with pytest.raises(TypeError, match=mentions("Attention", "window_size")):
        flashattn_ext.nn.Attention(32, 4, window_size=(2.5, 0))
    with pytest.raises(TypeError, match=mentions("Attention", "softcap")):
        flashattn_ext.nn.Attention(32, 4, softcap="1")
    with pytest.raises(ValueError, match=mentions("Attention", "dropout_p")):
        flashattn_ext.nn.Attention(32, 4, dropout=1.5)
    mha = flashattn_ext.nn.MultiheadAttention(32, 4, batch_first=True)
    x = torch.randn(2, 5, 32)
    with pytest.raises(TypeError, match=mentions("MultiheadAttention", "is_causal", "bool")):
        mha(x, x, x, need_weights=False, is_causal=1)


# ----------------------------------------------------------------------------------------------
# One forward op, one backward op: the optional arguments that select a varlen batch or a KV cache must go
# together; a wrong mix raises, naming the arguments, from the op and from its fake kernel (meta tensors).
# ----------------------------------------------------------------------------------------------

def routing_calls():
    """(name, op, kwargs, words of the message) of calls that mix the optional arguments wrongly."""
    q, k, v = qkv()
    vq, vk, vv = q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)
    cu_q, cu_k = torch.tensor([0, 5, 10], dtype=torch.int32), torch.tensor([0, 7, 14], dtype=torch.int32)
    used = torch.tensor([7, 6], dtype=torch.int32)
    mask = torch.zeros(MASK_SHAPE)
    dense = dict(q=q, k=k, v=v, softmax_scale=0.5)
    varlen = dict(q=vq, k=vk, v=vv, softmax_scale=0.5, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=5,
                  max_seqlen_k=7)
    out, lse, rng, _ = fwd_op(**dense)
    v_out, v_lse, v_rng, _ = fwd_op(**varlen)
    dense_bwd = dict(dout=out, out=out, lse=lse, rng_state=rng, **dense)
    varlen_bwd = dict(dout=v_out, out=v_out, lse=v_lse, rng_state=v_rng, **varlen)
    half = {n: t for n, t in varlen.items() if n != "cu_seqlens_k"}
    return [
        ("fwd-cu_seqlens_q-alone", fwd_op, half, ("cu_seqlens_q", "cu_seqlens_k", "together")),
        ("bwd-cu_seqlens_q-alone", bwd_op, {n: t for n, t in varlen_bwd.items() if n != "cu_seqlens_k"},
         ("cu_seqlens_q", "cu_seqlens_k", "together")),
        ("fwd-seqused_k-dense", fwd_op, dict(dense, seqused_k=used), ("seqused_k", "cu_seqlens_q")),
        ("bwd-seqused_k-dense", bwd_op, dict(dense_bwd, seqused_k=used), ("seqused_k", "cu_seqlens_q")),
        ("fwd-varlen-mask", fwd_op, dict(varlen, attn_mask=mask), ("attn_mask", "not supported", "varlen")),
        ("bwd-varlen-mask", bwd_op, dict(varlen_bwd, attn_mask=mask), ("attn_mask", "not supported", "varlen")),
        ("fwd-varlen-top-left", fwd_op, dict(varlen, bottom_right=False), ("bottom_right", "True", "varlen")),
        ("fwd-varlen-cache_seqlens", fwd_op, dict(varlen, cache_seqlens=used), ("cache_seqlens", "cu_seqlens_q")),
        ("fwd-varlen-num_splits", fwd_op, dict(varlen, num_splits=2), ("num_splits", "cu_seqlens_q")),
        ("fwd-cache-mask", fwd_op, dict(dense, cache_seqlens=used, attn_mask=mask),
         ("attn_mask", "not supported", "KV cache")),
        ("fwd-cache-dropout", fwd_op, dict(dense, cache_seqlens=used, dropout_p=0.1), ("dropout_p", "KV cache")),
        ("fwd-cache-top-left", fwd_op, dict(dense, num_splits=1, bottom_right=False), ("bottom_right", "KV cache")),
    ]


ROUTING_IDS = [c[0] for c in routing_calls()]


@pytest.mark.parametrize("meta", [False, True], ids=["cpu", "meta"])
@pytest.mark.parametrize("index", range(len(ROUTING_IDS)), ids=ROUTING_IDS)
def test_optional_arguments_that_do_not_go_together(index, meta):
    _, op, kwargs, words = routing_calls()[index]
    if meta:
        kwargs = {n: t.to("meta") if isinstance(t, torch.Tensor) and n != "rng_state" else t for n, t in kwargs.items()}
    with pytest.raises(RuntimeError, match=mentions(*words)):
        op(**kwargs)


def test_max_seqlen_needs_cu_seqlens():
    """max_seqlen_* without cu_seqlens (checked by the op; its fake kernel leaves symbolic sizes unguarded)."""
    q, k, v = qkv()
    for name in ("max_seqlen_q", "max_seqlen_k"):
        with pytest.raises(RuntimeError, match=mentions("max_seqlen_q", "max_seqlen_k", "cu_seqlens_q")):
            fwd_op(q, k, v, 0.5, **{name: 5})


def test_cache_call_has_no_backward():
    """fwd over a KV cache (flash_attn_with_kvcache's call) has no backward: its autograd raises, as flash-attn's."""
    q, k, v = (t.requires_grad_() for t in qkv())
    out, *_ = fwd_op(q, k, v, 0.5, cache_seqlens=torch.tensor([7, 3], dtype=torch.int32))
    with pytest.raises(RuntimeError, match=mentions("KV cache", "no backward")):
        out.sum().backward()
