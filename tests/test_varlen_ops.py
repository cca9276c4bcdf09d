"""The varlen calls of the ops (torch.ops.flashattn_ext.fwd / bwd with cu_seqlens) against their dense calls,
sequence by sequence: on the CPU in float64, and with a CUDA device in every CUDA dtype (the dense CUDA op of the
same dtype is the reference there).

Sequence s of a packed batch must equal the dense op on a batch in which it sits at batch index s (the
other entries are zeros): bottom-right aligned causal / window, the same variants, and dropout with the
same rng_state (the Philox counter of batch index s). Rows of no sequence and keys past seqused_k get
zeros (lse -inf). The public API (flash_attn_varlen_func) is tested in tests/test_varlen.py.
"""
import math

import pytest
import torch

import flashattn_ext  # noqa: F401  (registers torch.ops.flashattn_ext)
from fa_testing import varlen_bwd_op, varlen_fwd_op

OPS = torch.ops.flashattn_ext
NO_WINDOW = -1
DROPOUT_SEED = 1234
HAS_CUDA = torch.cuda.is_available()
# (atol, rtol) against the dense op: float64 / float32 differ by summation order only; fp16 / bf16 by
# the order of fp32 atomics in dQ and a rounding of the result.
TOLERANCES = {
    torch.float64: (1e-12, 1e-10),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}
_CUDA = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
CONFIGS = [pytest.param(("cpu", torch.float64), id="cpu-fp64")] + [
    pytest.param(("cuda", dt), id=f"cuda-{name}", marks=[pytest.mark.cuda, _CUDA])
    for name, dt in (("fp64", torch.float64), ("fp32", torch.float32), ("fp16", torch.float16),
                     ("bf16", torch.bfloat16))
]


@pytest.fixture(params=CONFIGS)
def config(request):
    """(device, dtype) of a test."""
    return request.param


def _lse_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _cu(lengths, device):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def _packed(rows, heads, d, strided, config):
    """(rows, heads, d) random; strided: a view into a wider buffer (row stride > heads * d)."""
    device, dtype = config
    if strided:
        return torch.randn(rows, heads, d + 3, dtype=dtype, device=device)[:, :, 1:d + 1]
    return torch.randn(rows, heads, d, dtype=dtype, device=device)


def _make_case(config, lq, lk, h, h_kv, d, pad_q=0, pad_k=0, used=None, strided=False):
    device = config[0]
    cu_q, cu_k = _cu(lq, device), _cu(lk, device)
    total_q, total_k = int(cu_q[-1]) + pad_q, int(cu_k[-1]) + pad_k
    q = _packed(total_q, h, d, strided, config)
    k = _packed(total_k, h_kv, d, strided, config)
    v = _packed(total_k, h_kv, d, strided, config)
    dout = _packed(total_q, h, d, strided, config)
    seqused = None if used is None else torch.tensor(used, dtype=torch.int32, device=device)
    return q, k, v, dout, cu_q, cu_k, seqused


def _varlen(q, k, v, dout, cu_q, cu_k, seqused, lq, lk, kw):
    torch.manual_seed(DROPOUT_SEED)
    out, lse, rng, _ = varlen_fwd_op(q, k, v, cu_q, cu_k, seqused, max(lq), max(lk), kw["scale"], kw["causal"],
                                   kw["window"][0], kw["window"][1], kw["softcap"], kw["alibi"], kw["sink"],
                                   kw["dropout_p"], False)
    dq, dk, dv, _ = varlen_bwd_op(dout, q, k, v, out, lse, rng, cu_q, cu_k, seqused, max(lq), max(lk),
                                   kw["scale"], kw["causal"], kw["window"][0], kw["window"][1], kw["softcap"],
                                   kw["alibi"], kw["sink"], kw["dropout_p"], False)
    return out, lse, rng, dq, dk, dv


def _dense_at(s, q_s, k_s, v_s, dout_s, kw):
    """The dense op on a batch of s + 1 with sequence s at batch index s (zeros elsewhere)."""
    def at_s(t):
        full = t.new_zeros((s + 1,) + tuple(t.shape))
        full[s] = t
        return full
    alibi = kw["alibi"]
    if alibi is not None and alibi.dim() == 2:
        alibi = at_s(alibi[s])
    q, k, v, dout = at_s(q_s), at_s(k_s), at_s(v_s), at_s(dout_s)
    args = (kw["scale"], kw["causal"], True, kw["window"][0], kw["window"][1], kw["softcap"], alibi, kw["sink"], None,
            kw["dropout_p"], False)
    torch.manual_seed(DROPOUT_SEED)
    out, lse, rng, _ = OPS.fwd(q, k, v, *args)
    dq, dk, dv, _, _ = OPS.bwd(dout, q, k, v, out, lse, rng, *args, False)
    return out[s], lse[s], rng, dq[s], dk[s], dv[s]


def _check(config, lq, lk, h=2, h_kv=1, d=16, pad_q=0, pad_k=0, used=None, strided=False, causal=False,
           window=(NO_WINDOW, NO_WINDOW), softcap=0.0, alibi=None, sink=False, dropout_p=0.0):
    device, dtype = config
    q, k, v, dout, cu_q, cu_k, seqused = _make_case(config, lq, lk, h, h_kv, d, pad_q, pad_k, used, strided)
    b = len(lq)
    slopes = None
    if alibi == "h":
        slopes = torch.rand(h, dtype=torch.float32, device=device) + 0.1
    elif alibi == "bh":
        slopes = torch.rand(b, h, dtype=torch.float32, device=device) + 0.1
    kw = dict(scale=1 / math.sqrt(d), causal=causal, window=window, softcap=softcap, alibi=slopes,
              sink=torch.randn(h, dtype=_lse_dtype(dtype), device=device) if sink else None, dropout_p=dropout_p)
    out, lse, rng, dq, dk, dv = _varlen(q, k, v, dout, cu_q, cu_k, seqused, lq, lk, kw)
    assert out.shape == q.shape and lse.shape == (h, q.shape[0]) and lse.dtype == _lse_dtype(dtype)
    assert out.dtype == dtype and out.device == q.device
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    atol, rtol = TOLERANCES[dtype]
    for s in range(b):
        q0, k0 = int(cu_q[s]), int(cu_k[s])
        sq, sk = lq[s], lk[s] if used is None else min(used[s], lk[s])
        d_out, d_lse, d_rng, d_dq, d_dk, d_dv = _dense_at(s, q[q0:q0 + sq], k[k0:k0 + sk], v[k0:k0 + sk],
                                                          dout[q0:q0 + sq], kw)
        assert torch.equal(d_rng, rng)
        torch.testing.assert_close(out[q0:q0 + sq], d_out, atol=atol, rtol=rtol)
        torch.testing.assert_close(lse[:, q0:q0 + sq], d_lse, atol=atol, rtol=rtol)
        torch.testing.assert_close(dq[q0:q0 + sq], d_dq, atol=atol, rtol=rtol)
        torch.testing.assert_close(dk[k0:k0 + sk], d_dk, atol=atol, rtol=rtol)
        torch.testing.assert_close(dv[k0:k0 + sk], d_dv, atol=atol, rtol=rtol)
        # keys of the sequence past seqused_k: no gradient
        assert not dk[k0 + sk:k0 + lk[s]].any() and not dv[k0 + sk:k0 + lk[s]].any()
    end_q, end_k = int(cu_q[-1]), int(cu_k[-1])
    assert not out[end_q:].any() and not dq[end_q:].any()
    assert torch.isneginf(lse[:, end_q:]).all()
    assert not dk[end_k:].any() and not dv[end_k:].any()


MIXES = [
    ([5, 0, 1, 33, 17], [7, 3, 0, 33, 40]),
    ([1], [1]),
    ([70, 2, 129], [129, 70, 2]),
    ([0, 0, 4], [0, 5, 4]),
]


@pytest.mark.parametrize("lq,lk", MIXES)
@pytest.mark.parametrize("causal", [False, True])
def test_lengths(config, lq, lk, causal):
    _check(config, lq, lk, causal=causal)


@pytest.mark.parametrize("window", [(3, 2), (NO_WINDOW, 0), (5, NO_WINDOW), (0, 0)])
def test_window(config, window):
    _check(config, [9, 1, 40, 0], [30, 4, 17, 2], window=window)
    _check(config, [9, 1, 40, 0], [30, 4, 17, 2], window=window, causal=True)


@pytest.mark.parametrize("variant", [
    dict(softcap=2.0),
    dict(alibi="h", causal=True),
    dict(alibi="bh"),
    dict(sink=True, causal=True),
    dict(dropout_p=0.3),
    dict(dropout_p=0.2, causal=True, window=(6, NO_WINDOW)),
    dict(softcap=1.5, alibi="bh", sink=True, dropout_p=0.25, window=(7, 3)),
])
def test_variants(config, variant):
    _check(config, [5, 0, 1, 33, 17], [7, 3, 0, 33, 40], h=4, h_kv=2, **variant)


@pytest.mark.parametrize("h,h_kv", [(4, 1), (6, 3), (3, 3)])
def test_gqa(config, h, h_kv):
    _check(config, [12, 1, 20], [20, 7, 1], h=h, h_kv=h_kv, causal=True)


def test_long_sequences(config):
    """Several query and key tiles per sequence (CPU 128 x 64, CUDA up to 128 x 128)."""
    _check(config, [300, 1, 257, 129], [257, 300, 1, 520], h=4, h_kv=2, d=64, causal=True)
    _check(config, [300, 130], [520, 129], h=2, h_kv=2, d=128, window=(100, 20), softcap=5.0, dropout_p=0.1)


def test_seqused_k_and_rows_of_no_sequence(config):
    _check(config, [12, 3, 20, 5], [20, 7, 9, 6], h=4, h_kv=2, used=[11, 0, 9, 2], pad_q=3, pad_k=4, causal=True)
    _check(config, [12, 3, 20, 5], [20, 7, 9, 6], used=[25, 7, 1, 0], dropout_p=0.3, sink=True, alibi="bh")


def test_strided_and_odd_head_dim(config):
    _check(config, [9, 33, 2], [17, 33, 40], d=3, strided=True, pad_q=2, pad_k=1, softcap=3.0)
    _check(config, [9, 33, 2], [17, 33, 40], d=1, h=3, h_kv=1, causal=True)
    _check(config, [9, 33, 2], [17, 33, 40], d=72, h=4, h_kv=1, strided=True, pad_k=3, causal=True)


def test_larger_max_seqlen_than_the_sequences(config):
    q, k, v, dout, cu_q, cu_k, _ = _make_case(config, [5, 9], [8, 3], 2, 2, 8)
    kw = dict(scale=0.3, causal=True, window=(NO_WINDOW, NO_WINDOW), softcap=0.0, alibi=None, sink=None, dropout_p=0.0)
    want = _varlen(q, k, v, dout, cu_q, cu_k, None, [5, 9], [8, 3], kw)
    got = _varlen(q, k, v, dout, cu_q, cu_k, None, [200], [300], kw)
    atol, rtol = TOLERANCES[config[1]]
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol)


def test_no_keys_anywhere(config):
    device, dtype = config
    q, k, v, dout, cu_q, cu_k, _ = _make_case(config, [3, 4], [0, 0], 2, 1, 8, pad_q=1)
    sink = torch.randn(2, dtype=_lse_dtype(dtype), device=device)
    out, lse, rng, _ = varlen_fwd_op(q, k, v, cu_q, cu_k, None, 4, 0, 0.5, False, -1, -1, 0.0, None, sink, 0.0, False)
    assert not out.any()
    torch.testing.assert_close(lse[:, :7], sink[:, None].expand(2, 7))
    assert torch.isneginf(lse[:, 7:]).all()
    dq, dk, dv, _ = varlen_bwd_op(dout, q, k, v, out, lse, rng, cu_q, cu_k, None, 4, 0, 0.5, False, -1, -1, 0.0, None,
                                   sink, 0.0, False)
    assert not dq.any() and dk.shape == k.shape and dv.shape == v.shape


def test_float32():
    lq, lk = [5, 0, 1, 33, 17], [7, 3, 0, 33, 40]
    q, k, v, dout, cu_q, cu_k, _ = _make_case(("cpu", torch.float64), lq, lk, 2, 1, 16)
    kw = dict(scale=0.25, causal=True, window=(NO_WINDOW, NO_WINDOW), softcap=0.0, alibi=None, sink=None, dropout_p=0.0)
    want = _varlen(q, k, v, dout, cu_q, cu_k, None, lq, lk, kw)
    got = _varlen(q.float(), k.float(), v.float(), dout.float(), cu_q, cu_k, None, lq, lk, kw)
    assert got[1].dtype == torch.float32
    for w, g in zip(want, got):
        if w.is_floating_point():
            torch.testing.assert_close(g.double(), w, atol=2e-5, rtol=2e-5)


DTYPE = torch.float64


def _fwd_args(q, k, v, cu_q, cu_k, seqused=None, max_q=4, max_k=4, alibi=None):
    return (q, k, v, cu_q, cu_k, seqused, max_q, max_k, 0.5, False, -1, -1, 0.0, alibi, None, 0.0, False)


@pytest.mark.parametrize("change,match", [
    (dict(q=torch.zeros(1, 4, 2, 8, dtype=DTYPE)), "q must have 3 dimensions"),
    (dict(k=torch.zeros(8, 2, 8, dtype=torch.float32)), "same dtype"),
    (dict(k=torch.zeros(8, 2, 4, dtype=DTYPE)), "head dim .* of q and k must match"),
    (dict(k=torch.zeros(8, 3, 8, dtype=DTYPE), v=torch.zeros(8, 3, 8, dtype=DTYPE)), "multiple of nheads"),
    (dict(q=torch.zeros(8, 16, 2, dtype=DTYPE).transpose(1, 2)), "stride 1"),
    (dict(cu_q=torch.tensor([0, 4, 8])), "cu_seqlens_q must be int32"),
    (dict(cu_k=torch.tensor([[0, 4, 8]], dtype=torch.int32)), "cu_seqlens_k must have 1 dimension"),
    (dict(cu_k=torch.tensor([0, 4], dtype=torch.int32)), "cu_seqlens_k must have the length"),
    (dict(cu_q=torch.tensor([0], dtype=torch.int32), cu_k=torch.tensor([0], dtype=torch.int32)), "batch \\+ 1 >= 2"),
    (dict(cu_q=torch.tensor([0, 0, 4, 4, 8], dtype=torch.int32)[::2]), "cu_seqlens_q must be contiguous"),
    (dict(seqused=torch.tensor([1, 2, 3], dtype=torch.int32)), "seqused_k must have shape"),
    (dict(seqused=torch.tensor([1, 2], dtype=torch.int64)), "seqused_k must be int32"),
    (dict(max_q=-1), "max_seqlen_q must be >= 0"),
    (dict(max_k=-2), "max_seqlen_k must be >= 0"),
    (dict(alibi=torch.ones(3, 2)), "alibi_slopes must have shape"),
    (dict(alibi=torch.ones(2, dtype=DTYPE)), "alibi_slopes must be float32"),
])
def test_bad_inputs(change, match):
    args = dict(q=torch.zeros(8, 2, 8, dtype=DTYPE), k=torch.zeros(8, 2, 8, dtype=DTYPE),
                v=torch.zeros(8, 2, 8, dtype=DTYPE), cu_q=torch.tensor([0, 4, 8], dtype=torch.int32),
                cu_k=torch.tensor([0, 4, 8], dtype=torch.int32))
    args.update(change)
    with pytest.raises(RuntimeError, match=match):
        varlen_fwd_op(*_fwd_args(**args))


def test_bad_backward_inputs():
    q = torch.zeros(8, 2, 8, dtype=DTYPE)
    cu = torch.tensor([0, 4, 8], dtype=torch.int32)
    out, lse, rng, _ = varlen_fwd_op(*_fwd_args(q, q, q, cu, cu))
    tail = (cu, cu, None, 4, 4, 0.5, False, -1, -1, 0.0, None, None, 0.0, False)
    with pytest.raises(RuntimeError, match="lse must have shape"):
        varlen_bwd_op(q, q, q, q, out, lse.t(), rng, *tail)
    with pytest.raises(RuntimeError, match="dout must have the shape of q"):
        varlen_bwd_op(q[:4], q, q, q, out, lse, rng, *tail)
    with pytest.raises(RuntimeError, match="rng_state"):
        varlen_bwd_op(q, q, q, q, out, lse, rng.int(), *tail)
