"""Double backward (issue 33): gradgradcheck in float64 of every public function and variant (through the
autograd of the bwd / varlen_bwd ops and of the sink gradient), third order, a gradient penalty
(loss + ||dL/dx||^2) against eager float64 attention (fa_testing.attention64) to 1e-9, the memory audit of
the query blocks, and CUDA bf16 against the float64 CPU penalty. Small shapes: the blocks are forced down
to one or three query rows so that the tiling is exercised."""
import math

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

import flashattn_ext
import flashattn_ext.nn as fnn
from flashattn_ext import double_backward
from fa_testing import HAS_CUDA, attention64, rel_l2

F64 = torch.float64
PENALTY_TOL = 1e-9
DROPOUT_SEED = 1234


@pytest.fixture(params=[1, 3], ids=["block1", "block3"])
def block_rows(request, monkeypatch):
    """Query blocks of 1 or 3 rows in every double backward of the test (test_query_block_budget and the
    memory audit check query_block itself)."""
    rows = request.param
    monkeypatch.setattr(double_backward, "query_block",
                        lambda batch, nheads, seqlen_q, seqlen_k, dtype, device_type="cpu": max(1, min(seqlen_q, rows)))
    return rows


def seeded(fn, seed=DROPOUT_SEED):
    """fn with torch's CPU generator reseeded at every call, so that dropout draws the same mask each time."""
    def call(*args):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return fn(*args)
    return call


def rand(*shape, gen, device="cpu", dtype=F64, grad=True):
    return torch.randn(*shape, generator=gen, dtype=F64).to(device=device, dtype=dtype).requires_grad_(grad)


def dense_inputs(b=2, sq=5, sk=7, h=2, hkv=1, d=3, device="cpu", dtype=F64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (rand(b, sq, h, d, gen=gen, device=device, dtype=dtype), rand(b, sk, hkv, d, gen=gen, device=device,
            dtype=dtype), rand(b, sk, hkv, d, gen=gen, device=device, dtype=dtype))


def float_mask(shape, gen, hide=True):
    """An additive mask of N(0, 1) values with -inf entries, one row entirely hidden (if hide)."""
    m = torch.randn(shape, generator=gen, dtype=F64)
    m = m.masked_fill(torch.rand(shape, generator=gen) < 0.25, -math.inf)
    if hide:
        m[..., 1, :] = -math.inf
    return m.requires_grad_()


# (name, flash_attn_func keyword arguments, extra differentiable inputs: "sink" / "mask")
VARIANTS = [
    ("dense", {}, ()),
    ("causal", {"causal": True}, ()),
    ("window", {"window_size": (2, 1)}, ()),
    ("causal_window", {"causal": True, "window_size": (1, -1)}, ()),
    ("softcap", {"softcap": 1.5}, ()),
    ("alibi_h", {"alibi": "h", "causal": True}, ()),
    ("alibi_bh", {"alibi": "bh"}, ()),
    ("sink", {}, ("sink",)),
    ("sink_causal_softcap", {"causal": True, "softcap": 2.0}, ("sink",)),
    ("mask_bool", {"mask": "bool"}, ()),
    ("mask_float", {}, ("mask",)),
    ("mask_float_sink", {"causal": True}, ("sink", "mask")),
    ("dropout", {"dropout_p": 0.3}, ()),
    ("dropout_sink_window", {"dropout_p": 0.2, "window_size": (3, 0)}, ("sink",)),
]


def variant_call(kw, extras, b, sq, sk, h, gen, device="cpu"):
    """(function of (q, k, v, *extra tensors), extra tensors, constants) for a VARIANTS entry: the extra
    tensors are the sink (float64) and the float mask (float64, -inf entries) as extras says; constants
    holds flash_attn_func's alibi_slopes and bool attn_mask (None where off)."""
    kw = dict(kw)
    alibi = kw.pop("alibi", None)
    mask_kind = kw.pop("mask", None)
    consts = {"alibi_slopes": None, "attn_mask": None}
    if alibi is not None:
        consts["alibi_slopes"] = (0.05 + 0.5 * torch.rand((h,) if alibi == "h" else (b, h), generator=gen)).to(device)
    if mask_kind == "bool":
        consts["attn_mask"] = (torch.rand(b, 1, sq, sk, generator=gen) < 0.7).to(device)
    tensors = []
    if "sink" in extras:
        tensors.append(rand(h, gen=gen))
    if "mask" in extras:
        tensors.append(float_mask((b, h, sq, sk), gen))

    def fn(q, k, v, *extra):
        named = dict(zip(extras, extra))
        return flashattn_ext.flash_attn_func(q, k, v, sink=named.get("sink"),
                                             attn_mask=named.get("mask", consts["attn_mask"]),
                                             alibi_slopes=consts["alibi_slopes"], **kw)
    return (seeded(fn) if kw.get("dropout_p") else fn), tensors, consts


@pytest.mark.parametrize("shape", [(5, 7), (7, 4)], ids=["sq<sk", "sq>sk"])
@pytest.mark.parametrize("name,kw,extras", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_gradgradcheck_flash_attn_func(name, kw, extras, shape, block_rows):
    sq, sk = shape
    gen = torch.Generator().manual_seed(len(name))
    q, k, v = dense_inputs(b=2, sq=sq, sk=sk, h=2, hkv=1, d=3, seed=len(name))
    fn, tensors, _ = variant_call(kw, extras, 2, sq, sk, 2, gen)
    assert gradgradcheck(fn, (q, k, v, *tensors), fast_mode=True)


def test_gradgradcheck_full_jacobian(block_rows):
    """The full (not projected) second-order Jacobian on one small case with a sink and causal empty rows."""
    q, k, v = dense_inputs(b=1, sq=4, sk=3, h=2, hkv=2, d=2, seed=3)
    sink = rand(2, gen=torch.Generator().manual_seed(4))
    fn = lambda q, k, v, s: flashattn_ext.flash_attn_func(q, k, v, causal=True, softcap=3.0, sink=s)  # noqa: E731
    assert gradgradcheck(fn, (q, k, v, sink))


@pytest.mark.parametrize("hkv", [1, 2, 4], ids=["mqa", "gqa", "mha"])
def test_gradgradcheck_heads(hkv, block_rows):
    q, k, v = dense_inputs(b=1, sq=4, sk=5, h=4, hkv=hkv, d=2, seed=hkv)
    assert gradgradcheck(lambda q, k, v: flashattn_ext.flash_attn_func(q, k, v, causal=True), (q, k, v),
                         fast_mode=True)


def test_third_order(block_rows):
    """gradgradcheck of the first-order gradient (with create_graph) checks the third derivatives."""
    q, k, v = dense_inputs(b=1, sq=4, sk=5, h=2, hkv=1, d=2, seed=5)
    sink = rand(2, gen=torch.Generator().manual_seed(6))
    w = torch.randn(1, 4, 2, 2, dtype=F64, generator=torch.Generator().manual_seed(7))

    def grads(q, k, v, s):
        out = flashattn_ext.flash_attn_func(q, k, v, causal=True, sink=s)
        return torch.autograd.grad((out * w).sum(), (q, k, v, s), create_graph=True)
    assert gradgradcheck(grads, (q, k, v, sink), fast_mode=True)


@pytest.mark.parametrize("case", ["dense", "causal", "mask_float", "mask_bool", "gqa", "dropout"])
def test_gradgradcheck_sdpa(case, block_rows):
    gen = torch.Generator().manual_seed(11)
    hkv = 1 if case == "gqa" else 2
    q, k, v = (rand(2, n, s, 3, gen=gen) for n, s in ((2, 5), (hkv, 4), (hkv, 4)))
    extra, kw = [], {}
    if case == "causal":
        kw["is_causal"] = True
    if case == "mask_bool":
        kw["attn_mask"] = torch.rand(5, 4, generator=gen) < 0.7
    if case == "gqa":
        kw["enable_gqa"] = True
    if case == "dropout":
        kw["dropout_p"] = 0.25
    if case == "mask_float":
        extra = [float_mask((2, 1, 5, 4), gen)]

    def fn(q, k, v, *m):
        return flashattn_ext.scaled_dot_product_attention(q, k, v, *m, **kw)
    assert gradgradcheck(seeded(fn) if case == "dropout" else fn, (q, k, v, *extra), fast_mode=True)


def test_gradgradcheck_packed(block_rows):
    gen = torch.Generator().manual_seed(12)
    qkv = rand(1, 5, 3, 2, 3, gen=gen)
    q, kv = rand(1, 4, 2, 3, gen=gen), rand(1, 6, 2, 1, 3, gen=gen)
    assert gradgradcheck(lambda t: flashattn_ext.flash_attn_qkvpacked_func(t, causal=True), (qkv,), fast_mode=True)
    assert gradgradcheck(lambda q, kv: flashattn_ext.flash_attn_kvpacked_func(q, kv, softcap=2.0), (q, kv),
                         fast_mode=True)


def cu(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


VARLEN_Q, VARLEN_K = (3, 0, 5, 2), (4, 2, 3, 5)  # an empty query sequence; sq > sk in one


@pytest.mark.parametrize("case", ["plain", "causal_alibi_bh", "sink_window", "softcap_seqused", "dropout"])
def test_gradgradcheck_varlen(case, block_rows):
    gen = torch.Generator().manual_seed(13)
    b, h, hkv = len(VARLEN_Q), 2, 1
    q, k, v = rand(sum(VARLEN_Q) + 1, h, 2, gen=gen), rand(sum(VARLEN_K), hkv, 2, gen=gen), \
        rand(sum(VARLEN_K), hkv, 2, gen=gen)  # one row of q in no sequence
    kw, extra = {}, []
    if case == "causal_alibi_bh":
        kw.update(causal=True, alibi_slopes=0.1 + torch.rand(b, h, generator=gen))
    if case == "sink_window":
        kw["window_size"] = (1, 1)
        extra = [rand(h, gen=gen)]
    if case == "softcap_seqused":
        kw.update(softcap=2.0, seqused_k=torch.tensor([4, 1, 2, 5], dtype=torch.int32))
    if case == "dropout":
        kw["dropout_p"] = 0.3
        extra = [rand(h, gen=gen)]

    def fn(q, k, v, *s):
        return flashattn_ext.flash_attn_varlen_func(q, k, v, cu(VARLEN_Q), cu(VARLEN_K), max(VARLEN_Q), max(VARLEN_K),
                                                    sink=s[0] if s else None, **kw)
    assert gradgradcheck(seeded(fn) if case == "dropout" else fn, (q, k, v, *extra), fast_mode=True)


def test_gradgradcheck_varlen_packed(block_rows):
    gen = torch.Generator().manual_seed(14)
    lens = (3, 4)
    qkv = rand(7, 3, 2, 2, gen=gen)
    q, kv = rand(7, 2, 2, gen=gen), rand(7, 2, 1, 2, gen=gen)
    assert gradgradcheck(lambda t: flashattn_ext.flash_attn_varlen_qkvpacked_func(t, cu(lens), 4, causal=True),
                         (qkv,), fast_mode=True)
    assert gradgradcheck(lambda q, kv: flashattn_ext.flash_attn_varlen_kvpacked_func(q, kv, cu(lens), cu(lens[::-1]),
                                                                                      4, 4), (q, kv), fast_mode=True)


def test_gradcheck_bwd_op_direct(block_rows):
    """torch.ops.flashattn_ext.bwd called by hand (out and lse from fwd): its autograd accounts for out and lse
    through q, k, v, so the composition is exact."""
    q, k, v = dense_inputs(b=1, sq=4, sk=5, h=2, hkv=1, d=2, seed=15)
    dout = rand(1, 4, 2, 2, gen=torch.Generator().manual_seed(16))

    def first_order(dout, q, k, v):
        out, lse, rng, _ = torch.ops.flashattn_ext.fwd(q, k, v, 0.7, True, False, -1, -1, 0.0, None, None, None, 0.0,
                                                    False)
        return torch.ops.flashattn_ext.bwd(dout, q, k, v, out, lse, rng, 0.7, True, False, -1, -1, 0.0, None, None,
                                           None, 0.0, False, False)[:3]
    assert gradcheck(first_order, (dout, q, k, v))


# ------------------------------------------------------------------------------------------------
# Gradient penalty against eager float64 attention
# ------------------------------------------------------------------------------------------------

def penalty_grads(fn, inputs, w):
    """d/d inputs of loss + sum over inputs of ||d loss / d input||^2, loss = sum(fn(*inputs) * w)."""
    loss = (fn(*inputs) * w).sum()
    firsts = torch.autograd.grad(loss, inputs, create_graph=True)
    total = loss + sum((g ** 2).sum() for g in firsts)
    return torch.autograd.grad(total, inputs)


def assert_penalty_close(ours, ref, names):
    for name, g, r in zip(names, ours, ref):
        assert torch.isfinite(g).all(), name
        err = rel_l2(g, r)
        assert err <= PENALTY_TOL, f"{name}: relative error {err:.3e}"


@pytest.mark.parametrize("name,kw,extras", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_gradient_penalty_vs_eager(name, kw, extras, block_rows):
    b, sq, sk, h = 2, 6, 5, 2
    gen = torch.Generator().manual_seed(21 + len(name))
    q, k, v = dense_inputs(b=b, sq=sq, sk=sk, h=h, hkv=1, d=4, seed=len(name))
    fn, tensors, consts = variant_call(kw, extras, b, sq, sk, h, gen)
    keep = None
    if kw.get("dropout_p"):  # the keep mask of the seeded call (the dropout_mask op, as the first-order tests)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(DROPOUT_SEED)
            _, _, rng, _ = torch.ops.flashattn_ext.fwd(q.detach(), k.detach(), v.detach(), 0.5, False, True, -1, -1,
                                                    0.0, None, None, None, kw["dropout_p"], False)
        keep = torch.ops.flashattn_ext.dropout_mask(q.detach(), rng, sk, kw["dropout_p"])
    inputs = (q, k, v, *tensors)
    w = torch.randn(b, sq, h, 4, generator=gen, dtype=F64)
    ours = penalty_grads(fn, inputs, w)

    def eager(q, k, v, *extra):
        named = dict(zip(extras, extra))
        return attention64(q, k, v, causal=kw.get("causal", False), window=kw.get("window_size", (-1, -1)),
                           softcap=kw.get("softcap", 0.0), alibi_slopes=consts["alibi_slopes"],
                           sink=named.get("sink"), attn_mask=named.get("mask", consts["attn_mask"]),
                           dropout_p=kw.get("dropout_p", 0.0), keep=keep)[0]
    ref = penalty_grads(eager, inputs, w)
    assert_penalty_close(ours, ref, ["q", "k", "v", *extras])


def test_gradient_penalty_sdpa_top_left(block_rows):
    gen = torch.Generator().manual_seed(31)
    q, k, v = (rand(2, 2, s, 3, gen=gen) for s in (6, 4, 4))
    w = torch.randn(2, 2, 6, 3, generator=gen, dtype=F64)
    ours = penalty_grads(lambda q, k, v: flashattn_ext.scaled_dot_product_attention(q, k, v, is_causal=True),
                         (q, k, v), w)
    ref = penalty_grads(lambda q, k, v: attention64(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                    causal=True, bottom_right=False)[0].transpose(1, 2), (q, k, v), w)
    assert_penalty_close(ours, ref, "qkv")


def test_gradient_penalty_varlen(block_rows):
    gen = torch.Generator().manual_seed(32)
    h = 2
    q, k, v = rand(sum(VARLEN_Q), h, 3, gen=gen), rand(sum(VARLEN_K), 1, 3, gen=gen), rand(sum(VARLEN_K), 1, 3,
                                                                                         gen=gen)
    sink = rand(h, gen=gen)
    w = torch.randn(sum(VARLEN_Q), h, 3, generator=gen, dtype=F64)
    cq, ck = cu(VARLEN_Q).tolist(), cu(VARLEN_K).tolist()
    ours = penalty_grads(lambda q, k, v, s: flashattn_ext.flash_attn_varlen_func(
        q, k, v, cu(VARLEN_Q), cu(VARLEN_K), max(VARLEN_Q), max(VARLEN_K), causal=True, sink=s), (q, k, v, sink), w)

    def eager(q, k, v, s):
        outs = [attention64(q[None, cq[i]:cq[i + 1]], k[None, ck[i]:ck[i + 1]], v[None, ck[i]:ck[i + 1]],
                            causal=True, sink=s)[0][0] for i in range(len(VARLEN_Q))]
        return torch.cat(outs)
    ref = penalty_grads(eager, (q, k, v, sink), w)
    assert_penalty_close(ours, ref, ["q", "k", "v", "sink"])


def test_gradient_penalty_nn_modules():
    """Gradient penalties through the nn modules: MultiheadAttention against torch's with the same weights,
    Attention against itself with an eager attend."""
    torch.manual_seed(41)
    ours = fnn.MultiheadAttention(8, 2, batch_first=True, dtype=F64)
    ref = torch.nn.MultiheadAttention(8, 2, batch_first=True, dtype=F64)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(2, 5, 8, dtype=F64, requires_grad=True)
    for mod in (ours, ref):
        with sdpa_kernel(SDPBackend.MATH):  # torch's CPU flash kernel has no double backward
            out = mod(x, x, x, need_weights=False)[0]
            (gx,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
            (gx.square().sum() + out.sum()).backward()
    for (n, p), pr in zip(ours.named_parameters(), ref.parameters()):
        assert rel_l2(p.grad, pr.grad) <= PENALTY_TOL, n

    class Eager(fnn.Attention):
        def attend(self, q, k, v, attn_mask=None):
            return attention64(q, k, v, causal=self.causal)[0]
    torch.manual_seed(42)
    mod = fnn.Attention(8, 4, num_kv_heads=2, dtype=F64)
    eager = Eager(8, 4, num_kv_heads=2, dtype=F64)
    eager.load_state_dict(mod.state_dict())
    x = torch.randn(2, 6, 8, dtype=F64, requires_grad=True)
    for m in (mod, eager):
        out = m(x)
        (gx,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
        (gx.square().sum() + out.sum()).backward()
    for (n, p), pr in zip(mod.named_parameters(), eager.parameters()):
        assert rel_l2(p.grad, pr.grad) <= PENALTY_TOL, n


# ------------------------------------------------------------------------------------------------
# Memory: the double backward holds one block of queries x seqlen_k at a time
# ------------------------------------------------------------------------------------------------

class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an op returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("case", ["dense", "sink_causal", "varlen"])
def test_double_backward_materializes_blocks_only(case, monkeypatch):
    """With a budget of 4 query rows per block (query_block's own logic), no tensor of the double backward
    has batch * nheads * seqlen_q * seqlen_k elements or more: at most a few blocks' worth."""
    b, sq, sk, h, d = 1, 64, 48, 2, 8
    rows = 4
    monkeypatch.setattr(double_backward, "BLOCK_BYTES", rows * b * h * sk * 8 * double_backward.BLOCK_TENSORS)
    assert double_backward.query_block(b, h, sq, sk, F64) == rows
    q, k, v = dense_inputs(b=b, sq=sq, sk=sk, h=h, hkv=1, d=d, seed=51)
    sink = rand(h, gen=torch.Generator().manual_seed(52)) if case == "sink_causal" else None
    if case == "varlen":
        out = flashattn_ext.flash_attn_varlen_func(q[0], k[0], v[0], cu((sq,)), cu((sk,)), sq, sk)
    else:
        out = flashattn_ext.flash_attn_func(q, k, v, causal=case == "sink_causal", sink=sink)
    inputs = (q, k, v) if sink is None else (q, k, v, sink)
    firsts = torch.autograd.grad(out.square().sum(), inputs, create_graph=True)
    penalty = sum(g.square().sum() for g in firsts)
    with LargestTensor() as mode:
        grads = torch.autograd.grad(penalty, inputs)
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
    assert rows * b * h * sk <= mode.largest < b * h * sq * sk / 4


def test_query_block_budget():
    """The default budgets: the blocks of the benchmark's shapes (B1 H8 fp32, S 1k-8k) are below seqlen_q (from
    S 8k on CUDA) and within BLOCK_BYTES (CPU) / CUDA_BLOCK_BYTES."""
    for device_type, budget in (("cpu", double_backward.BLOCK_BYTES), ("cuda", double_backward.CUDA_BLOCK_BYTES)):
        for s in (1024, 2048, 4096, 8192):
            rows = double_backward.query_block(1, 8, s, s, torch.float32, device_type)
            assert 1 <= rows <= s and (rows < s or device_type == "cuda" and s < 8192)
            assert rows * 8 * s * 4 * double_backward.BLOCK_TENSORS <= budget
    assert double_backward.query_block(1, 1, 3, 3, F64) == 3


# ------------------------------------------------------------------------------------------------
# CUDA
# ------------------------------------------------------------------------------------------------

CUDA_VARIANTS = [v for v in VARIANTS if v[0] in ("dense", "causal", "softcap", "alibi_h", "sink", "mask_float",
                                                 "dropout")]


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=["fp64", "bf16"])
@pytest.mark.parametrize("name,kw,extras", CUDA_VARIANTS, ids=[v[0] for v in CUDA_VARIANTS])
def test_gradient_penalty_cuda(name, kw, extras, dtype):
    """The gradient penalty on CUDA against eager float64 attention on the CPU (the same inputs, rounded to
    dtype first): 1e-9 in float64, bf16 rounding in bfloat16. Dropout: the keep mask of the CUDA call."""
    b, sq, sk, h, d = 2, 70, 90, 2, 64
    gen = torch.Generator().manual_seed(61)
    q, k, v = dense_inputs(b=b, sq=sq, sk=sk, h=h, hkv=1, d=d, seed=62)
    fn, tensors, consts = variant_call(kw, extras, b, sq, sk, h, gen, device="cuda")
    lse_dtype = F64 if dtype == F64 else torch.float32
    cuda = [t.detach().to("cuda", dtype).requires_grad_() for t in (q, k, v)]
    cuda += [t.detach().to("cuda", lse_dtype if n == "sink" else dtype).requires_grad_()
             for n, t in zip(extras, tensors)]
    cpu = [t.detach().cpu().to(F64).requires_grad_() for t in cuda]  # the same (rounded) values
    w = torch.randn(b, sq, h, d, generator=gen, dtype=F64)
    keep = None
    if kw.get("dropout_p"):
        with torch.random.fork_rng(devices=["cuda"]):
            torch.manual_seed(DROPOUT_SEED)
            _, _, rng, _ = torch.ops.flashattn_ext.fwd(*(t.detach() for t in cuda[:3]), 0.5, False, True, -1, -1, 0.0,
                                                    None, None, None, kw["dropout_p"], False)
        keep = torch.ops.flashattn_ext.dropout_mask(cuda[0].detach(), rng, sk, kw["dropout_p"]).cpu()
    got = penalty_grads(fn, cuda, w.to("cuda", dtype))

    def eager(q, k, v, *extra):
        named = dict(zip(extras, extra))
        alibi = consts["alibi_slopes"]
        return attention64(q, k, v, causal=kw.get("causal", False), softcap=kw.get("softcap", 0.0),
                           alibi_slopes=None if alibi is None else alibi.cpu(), sink=named.get("sink"),
                           attn_mask=named.get("mask"), dropout_p=kw.get("dropout_p", 0.0), keep=keep)[0]
    ref = penalty_grads(eager, cpu, w)
    tol = PENALTY_TOL if dtype == F64 else 5e-2
    for n, g, r in zip(["q", "k", "v", *extras], got, ref):
        assert torch.isfinite(g).all(), n
        assert rel_l2(g, r) <= tol, f"{n}: relative error {rel_l2(g, r):.3e}"
