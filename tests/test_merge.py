"""merge_attention_states against attention over the union of the two key sets (float64 reference),
in the dense layout and in the varlen layout flash_attn_varlen_func(return_lse=True) returns (against one
varlen call over all keys), rows where one or both sides saw no key,
gradients (gradcheck in float64), CPU and CUDA."""
import pytest
import torch

import flashattn_ext
from fa_testing import DEVICES, attention64, band_mask

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def split_attention(q, k, v, split, causal):
    """(out, lse) of q over keys [0, split) and over [split, sk), each bottom-right causal against the full
    key range when causal: the first part sees what the full call would, as does the second."""
    out_a, lse_a = flashattn_ext.flash_attn_func(q, k[:, :split], v[:, :split], return_lse=True,
                                                 window_size=(-1, k.shape[1] - split) if causal
                                                 else (-1, -1))
    out_b, lse_b = flashattn_ext.flash_attn_func(q, k[:, split:], v[:, split:], causal=causal, return_lse=True)
    return out_a, lse_a, out_b, lse_b


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("sq,sk,split,causal", [(5, 9, 4, False), (7, 7, 3, True), (12, 5, 2, True), (1, 17, 16, False)])
def test_merge_equals_union(device, dtype, sq, sk, split, causal):
    torch.manual_seed(sq * 100 + sk)
    q = torch.randn(2, sq, 4, 16, device=device, dtype=dtype)
    k = torch.randn(2, sk, 2, 16, device=device, dtype=dtype)
    v = torch.randn(2, sk, 2, 16, device=device, dtype=dtype)
    out, lse = flashattn_ext.merge_attention_states(*split_attention(q, k, v, split, causal))
    ref_out, ref_lse = attention64(q, k, v, causal=causal)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(out.double(), ref_out, atol=tol, rtol=tol)
    torch.testing.assert_close(lse.double(), ref_lse, atol=tol, rtol=tol)
    assert not out.isnan().any()


def varlen_halves(k, lengths, tail):
    """k (total_k, ...) of sequences with key lengths `lengths` -> (head keys, cu_seqlens), (tail keys,
    cu_seqlens): each sequence's keys split before its last `tail`."""
    heads, tails, cu_head, cu_tail, start = [], [], [0], [0], 0
    for n in lengths:
        heads.append(k[start:start + n - tail])
        tails.append(k[start + n - tail:start + n])
        cu_head.append(cu_head[-1] + n - tail)
        cu_tail.append(cu_tail[-1] + tail)
        start += n
    cu = lambda c: torch.tensor(c, dtype=torch.int32, device=k.device)  # noqa: E731
    return (torch.cat(heads), cu(cu_head)), (torch.cat(tails), cu(cu_tail))


VARLEN_LENS = [(5, 9), (7, 7), (1, 12), (6, 3)]  # (seqlen_q, seqlen_k); the last: no head keys, and with
VARLEN_TAIL = 3                                    # causal 3 queries see no key at all


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_merge_varlen_layout(device, dtype, causal):
    """A varlen batch's keys split per sequence into a head and its last VARLEN_TAIL keys, two
    flash_attn_varlen_func(return_lse=True) calls (the head with the window that bottom-right causal puts
    on it: right = VARLEN_TAIL), merged: the output and lse of one call over all keys."""
    gen = torch.Generator().manual_seed(3)
    total_q, total_k = sum(sq for sq, _ in VARLEN_LENS), sum(sk for _, sk in VARLEN_LENS)
    q, k, v = (torch.randn(total, h, 16, generator=gen, dtype=torch.float64).to(device, dtype)
               for total, h in ((total_q, 4), (total_k, 2), (total_k, 2)))
    cu_q = torch.tensor([0] + [sum(sq for sq, _ in VARLEN_LENS[:i + 1]) for i in range(len(VARLEN_LENS))],
                        dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + [sum(sk for _, sk in VARLEN_LENS[:i + 1]) for i in range(len(VARLEN_LENS))],
                        dtype=torch.int32, device=device)
    max_q, max_k = max(sq for sq, _ in VARLEN_LENS), max(sk for _, sk in VARLEN_LENS)
    lengths = [sk for _, sk in VARLEN_LENS]
    (k_a, cu_a), (k_b, cu_b) = varlen_halves(k, lengths, VARLEN_TAIL)
    (v_a, _), (v_b, _) = varlen_halves(v, lengths, VARLEN_TAIL)
    out_a, lse_a = flashattn_ext.flash_attn_varlen_func(q, k_a, v_a, cu_q, cu_a, max_q, max_k - VARLEN_TAIL,
                                                        window_size=(-1, VARLEN_TAIL if causal else -1),
                                                        return_lse=True)
    out_b, lse_b = flashattn_ext.flash_attn_varlen_func(q, k_b, v_b, cu_q, cu_b, max_q, VARLEN_TAIL, causal=causal,
                                                        return_lse=True)
    assert out_a.shape == (total_q, 4, 16) and lse_a.shape == (4, total_q)
    out, lse = flashattn_ext.merge_attention_states(out_a, lse_a, out_b, lse_b)
    ref_out, ref_lse = flashattn_ext.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal,
                                                            return_lse=True)
    tol = dict(atol=1e-12, rtol=1e-12) if dtype == torch.float64 else dict(atol=2e-6, rtol=1e-5)
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape and out.dtype == dtype
    torch.testing.assert_close(out, ref_out, **tol)
    torch.testing.assert_close(lse, ref_lse, **tol)
    if causal:  # the last sequence's first 3 queries (6 queries, 3 keys) see no key, on either side
        empty = slice(total_q - 6, total_q - 3)
        assert torch.isneginf(lse[:, empty]).all() and (out[empty] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_merge_varlen_gradcheck(device):
    torch.manual_seed(1)
    args = [torch.randn(5, 2, 4, device=device, dtype=torch.float64, requires_grad=True),
            torch.randn(2, 5, device=device, dtype=torch.float64, requires_grad=True),
            torch.randn(5, 2, 4, device=device, dtype=torch.float64, requires_grad=True),
            torch.randn(2, 5, device=device, dtype=torch.float64, requires_grad=True)]
    assert torch.autograd.gradcheck(flashattn_ext.merge_attention_states, args)


@pytest.mark.parametrize("device", DEVICES)
def test_merge_rows_without_keys(device):
    """-inf on one side: the other side unchanged; on both: out 0, lse -inf, finite gradients."""
    out_a = torch.randn(1, 3, 2, 4, device=device, dtype=torch.float64, requires_grad=True)
    out_b = torch.randn(1, 3, 2, 4, device=device, dtype=torch.float64, requires_grad=True)
    inf = float("-inf")
    lse_a = torch.tensor([[[inf, 0.5, inf], [1.0, inf, inf]]], device=device, dtype=torch.float64, requires_grad=True)
    lse_b = torch.tensor([[[0.2, inf, inf], [2.0, -1.0, inf]]], device=device, dtype=torch.float64, requires_grad=True)
    out, lse = flashattn_ext.merge_attention_states(out_a, lse_a, out_b, lse_b)
    assert torch.equal(out[0, 0, 0], out_b[0, 0, 0]) and torch.equal(out[0, 1, 0], out_a[0, 1, 0])
    assert torch.equal(out[0, 2], torch.zeros_like(out[0, 2])) and torch.isneginf(lse[0, :, 2]).all()
    assert lse[0, 0, 0].item() == pytest.approx(0.2) and lse[0, 1, 1].item() == pytest.approx(-1.0)
    grads = torch.autograd.grad((out.sum() + lse.masked_fill(lse.isinf(), 0).sum()), (out_a, lse_a, out_b, lse_b))
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("device", DEVICES)
def test_merge_gradcheck(device):
    torch.manual_seed(0)
    args = [torch.randn(1, 3, 2, 4, device=device, dtype=torch.float64, requires_grad=True),
            torch.randn(1, 2, 3, device=device, dtype=torch.float64, requires_grad=True),
            torch.randn(1, 3, 2, 4, device=device, dtype=torch.float64, requires_grad=True),
            torch.randn(1, 2, 3, device=device, dtype=torch.float64, requires_grad=True)]
    assert torch.autograd.gradcheck(flashattn_ext.merge_attention_states, args)


def test_merge_bad_inputs():
    o = torch.zeros(1, 3, 2, 4)
    lse = torch.zeros(1, 2, 3)
    with pytest.raises(ValueError, match="out_b"):
        flashattn_ext.merge_attention_states(o, lse, torch.zeros(1, 3, 2, 5), lse)
    with pytest.raises(ValueError, match="lse"):
        flashattn_ext.merge_attention_states(o, torch.zeros(1, 3, 2), o, torch.zeros(1, 3, 2))
    with pytest.raises(ValueError, match=r"lse must have shape \(nheads, total\)"):
        flashattn_ext.merge_attention_states(o[0], lse[0].T, o[0], lse[0].T)  # (total, nheads): transposed
    with pytest.raises(ValueError, match="out_a must have 4 dimensions"):
        flashattn_ext.merge_attention_states(o[0, 0], lse[0, 0], o[0, 0], lse[0, 0])
    with pytest.raises(TypeError, match="lse_a"):
        flashattn_ext.merge_attention_states(o, torch.zeros(1, 2, 3, dtype=torch.int64), o, lse)


def lse64(q, k, causal):
    """Differentiable float64 logsumexp of the visible scaled scores q.k (bottom-right causal), (B, H, Sq)."""
    kx = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kx) / q.shape[-1] ** 0.5
    vis = band_mask(q.shape[1], k.shape[1], causal, True, (-1, -1), q.device)
    return torch.logsumexp(torch.where(vis, s, torch.tensor(float("-inf"), dtype=s.dtype, device=s.device)), -1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_merge_gradients_equal_one_call(device, causal):
    """lse is differentiable: gradients of out and lse through a merge of two calls equal those of one call
    over all keys (float64), for q, k, v and the sink; the lse of one call passes gradcheck with every score
    variant that enters it (softcap, ALiBi, a float mask with its gradient, a sink)."""
    torch.manual_seed(3)
    sq, sk, split = 9, 13, 5
    q = torch.randn(2, sq, 4, 8, device=device, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, sk, 2, 8, device=device, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, sk, 2, 8, device=device, dtype=torch.float64, requires_grad=True)
    out_a, lse_a, out_b, lse_b = split_attention(q, k, v, split, causal)
    out, lse = flashattn_ext.merge_attention_states(out_a, lse_a, out_b, lse_b)
    full_out, full_lse = flashattn_ext.flash_attn_func(q, k, v, causal=causal, return_lse=True)
    g_out, g_lse = torch.randn_like(out), torch.randn_like(lse)
    merged = torch.autograd.grad((out * g_out).sum() + (lse.nan_to_num(0, 0, 0) * g_lse).sum(), (q, k, v))
    full = torch.autograd.grad((full_out * g_out).sum() + (full_lse.nan_to_num(0, 0, 0) * g_lse).sum(), (q, k, v))
    for name, a, b in zip("qkv", merged, full):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10, msg=name)
    # against the logsumexp of eager float64 scores
    ref_lse = lse64(q, k, causal)
    g_ref = torch.autograd.grad((ref_lse.nan_to_num(0, 0, 0) * g_lse).sum(), (q, k))
    full_lse = flashattn_ext.flash_attn_func(q, k, v, causal=causal, return_lse=True)[1]
    g_ours = torch.autograd.grad((full_lse.nan_to_num(0, 0, 0) * g_lse).sum(), (q, k))
    for a, b in zip(g_ours, g_ref):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
    sink = torch.randn(4, device=device, dtype=torch.float64, requires_grad=True)
    slopes = torch.rand(4, device=device, dtype=torch.float64).float()
    mask = torch.randn(2, 4, sq, sk, device=device, dtype=torch.float64, requires_grad=True)
    lse_of = lambda q, k, s, m: flashattn_ext.flash_attn_func(  # noqa: E731
        q, k, v.detach(), causal=causal, softcap=3.0, alibi_slopes=slopes, sink=s, attn_mask=m, return_lse=True)[1]
    assert torch.autograd.gradcheck(lse_of, (q, k, sink, mask))
    assert torch.autograd.gradgradcheck(lse_of, (q, k, sink, mask))


@pytest.mark.parametrize("device", DEVICES)
def test_lse_gradient_only_where_one_flows(device, monkeypatch):
    """A backward through out alone never runs lse's composite (the kernels' speed is untouched), eager and
    under torch.compile; a backward through lse alone still gives q, k their gradients (v none)."""
    from flashattn_ext import double_backward
    calls = []
    real = double_backward.lse_vjp
    monkeypatch.setattr(double_backward, "lse_vjp", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v = (torch.randn(1, 6, 2, 8, device=device, dtype=torch.float64, requires_grad=True) for _ in range(3))
    f = lambda q, k, v: flashattn_ext.flash_attn_func(q, k, v, causal=True, return_lse=True)  # noqa: E731
    f(q, k, v)[0].sum().backward()
    torch.compile(lambda q, k, v: f(q, k, v)[0], backend="aot_eager", fullgraph=True)(q, k, v).sum().backward()
    assert not calls
    gq, gk, gv = torch.autograd.grad(f(q, k, v)[1].sum(), (q, k, v), allow_unused=True)
    assert calls and gv is None
    lse_ref = lse64(q, k, True)
    for a, b in zip((gq, gk), torch.autograd.grad(lse_ref.sum(), (q, k))):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_merge_refuses_an_lse_without_gradient_beside_an_out_with_one():
    """flash_attn_varlen_func's lse carries no gradient: merging its halves while out requires grad raises
    (naming the argument) instead of returning gradients without lse's part; under no_grad it merges."""
    torch.manual_seed(0)
    cu = torch.tensor([0, 5, 9], dtype=torch.int32)
    q, k, v = (torch.randn(9, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    halves = [flashattn_ext.flash_attn_varlen_func(q, k[idx], v[idx], cu, cu, 5, 5, return_lse=True)
              for idx in (slice(0, 9), slice(0, 9))]
    with pytest.raises(ValueError, match="lse_a does not"):
        flashattn_ext.merge_attention_states(*halves[0], *halves[1])
    with torch.no_grad():
        out, _ = flashattn_ext.merge_attention_states(*halves[0], *halves[1])
    torch.testing.assert_close(out, halves[0][0].detach(), atol=1e-12, rtol=1e-12)  # two equal halves
