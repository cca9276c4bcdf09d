"""Every bad input raises, with a message naming the argument. C++ checks (TORCH_CHECK) surface as
RuntimeError; unsupported flash-attn / SDPA features as NotImplementedError."""
import pytest
import torch

import flashattn_ext
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


def through_both(fn_args):
    """Runs the bad inputs through the op and through flash_attn_func."""
    q, k, v = fn_args
    return [lambda: fwd_op(q, k, v, 0.5, False, True, False),
            lambda: flashattn_ext.flash_attn_func(q, k, v)]


def assert_raises_both(q, k, v, exc, pattern):
    for call in through_both((q, k, v)):
        with pytest.raises(exc, match=pattern):
            call()


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


def test_float16_rejected_on_cpu():
    for dt in (torch.float16, torch.bfloat16):
        q, k, v = qkv("cpu", dt)
        assert_raises_both(q, k, v, RuntimeError, mentions("CPU", "float32 or float64"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_wrong_ndim(device, which):
    q, k, v = qkv(device)
    bad = {"q": q, "k": k, "v": v}
    bad[which] = bad[which][0]  # 3-D
    assert_raises_both(bad["q"], bad["k"], bad["v"], RuntimeError, mentions(rf"\b{which}\b", "4 dimensions"))


@pytest.mark.parametrize("device", DEVICES)
def test_batch_mismatch(device):
    q, _, _ = qkv(device)
    _, k, v = qkv(device, b=3)
    assert_raises_both(q, k, v, RuntimeError, mentions("batch"))


@pytest.mark.parametrize("device", DEVICES)
def test_head_dim_mismatch(device):
    q, _, _ = qkv(device, d=8)
    _, k, v = qkv(device, d=16)
    assert_raises_both(q, k, v, RuntimeError, mentions("head ?dim"))
    q, k, _ = qkv(device, d=8)
    _, _, v = qkv(device, d=16)
    assert_raises_both(q, k, v, RuntimeError, mentions("head ?dim"))


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


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(dropout_p=0.1), "dropout_p"),
        (dict(window_size=(16, 0)), "window_size"),
        (dict(window_size=(-1, 4)), "window_size"),
        (dict(softcap=30.0), "softcap"),
        (dict(alibi_slopes=torch.ones(4)), "alibi_slopes"),
        (dict(return_attn_probs=True), "return_attn_probs"),
    ],
    ids=["dropout_p", "window_left", "window_right", "softcap", "alibi_slopes", "return_attn_probs"],
)
def test_flash_attn_func_unsupported_features(kwargs, name):
    q, k, v = qkv()
    with pytest.raises(NotImplementedError, match=mentions(name)):
        flashattn_ext.flash_attn_func(q, k, v, **kwargs)


def sdpa_inputs(h=4, hkv=4):
    q, k, v = qkv(h=h, hkv=hkv)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def test_sdpa_attn_mask():
    q, k, v = sdpa_inputs()
    with pytest.raises(NotImplementedError, match=mentions("attn_mask")):
        flashattn_ext.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 7, dtype=torch.bool))


def test_sdpa_dropout():
    q, k, v = sdpa_inputs()
    with pytest.raises(NotImplementedError, match=mentions("dropout_p")):
        flashattn_ext.scaled_dot_product_attention(q, k, v, dropout_p=0.5)


def test_sdpa_gqa_needs_enable_gqa():
    q, k, v = sdpa_inputs(h=4, hkv=2)
    with pytest.raises((ValueError, RuntimeError), match=mentions("enable_gqa")):
        flashattn_ext.scaled_dot_product_attention(q, k, v)
    out = flashattn_ext.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert out.shape == q.shape


def test_sdpa_wrong_ndim():
    q, k, v = sdpa_inputs()
    with pytest.raises((ValueError, RuntimeError), match=mentions("key", "4 dimensions")):
        flashattn_ext.scaled_dot_product_attention(q, k[0], v)


@pytest.mark.parametrize("device", DEVICES)
def test_bwd_op_checks(device):
    """The backward op validates what it did not compute itself: dout, out and lse."""
    q, k, v = qkv(device)
    out, lse = fwd_op(q, k, v, 0.5, False, True, False)
    dout = torch.randn_like(out)
    args = lambda **kw: [kw.get(n, x) for n, x in  # noqa: E731
                         (("dout", dout), ("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse))]
    bwd_op(*args(), 0.5, False, True, False)  # the good call works
    bad_cases = [
        (dict(dout=dout[:, :-1]), "dout"),
        (dict(dout=dout.double()), "dout"),
        (dict(out=out[:, :, :-1]), r"\bout\b"),
        (dict(lse=lse[:, :-1]), "lse"),
        (dict(lse=lse.double()), "lse"),
        (dict(q=q[..., :4]), "head ?dim"),
    ]
    for kw, name in bad_cases:
        with pytest.raises(RuntimeError, match=mentions(name)):
            bwd_op(*args(**kw), 0.5, False, True, False)

