"""T5's relative position bias (flash_attn_func's rel_bias): the buckets against transformers' own function, out,
lse and the gradients of q, k, v, sink and the table against the float64 reference with the bias as an additive
mask (the table gathered by bucket, so autograd gives the table's exact gradient), gradcheck in float64, and the
refusals (with ALiBi, double backward, bad arguments). Every dtype on the CPU and on CUDA, where the simple kernels
take the table (bitwise deterministic: gradcheck, repeated calls) and float16 / bfloat16 inputs run on them in
float32, with a warning."""
import itertools
import math

import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

import flashattn_ext
from flashattn_ext._checks import t5_buckets
from flashattn_ext.reference import attention_ref

from fa_testing import DTYPE_NAMES, requires_cuda, run_python


def bias_matrix(table, sq, sk, max_distance, bidirectional):
    """(nheads, sq, sk): table[h, bucket(j - i')], i' = i + sk - sq, the bucket by transformers' T5Attention."""
    i = torch.arange(sq).view(-1, 1) + (sk - sq)
    rel = torch.arange(sk).view(1, -1) - i
    buckets = T5Attention._relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=table.shape[1],
                                                    max_distance=max_distance)
    return table[:, buckets]


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20), (6, 7)])
def test_buckets_match_transformers(num_buckets, max_distance, bidirectional):
    radius = 600
    rel = torch.arange(-radius, radius + 1)
    want = T5Attention._relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets,
                                                 max_distance=max_distance)
    got = t5_buckets(num_buckets, max_distance, bidirectional, radius, "cpu")
    assert torch.equal(got.long(), want)
    # past max_distance every position falls in the bucket of +-max_distance (the kernels clamp there)
    assert torch.equal(want[rel >= max_distance], want[rel == max_distance].expand((rel >= max_distance).sum()))
    assert torch.equal(want[rel <= -max_distance], want[rel == -max_distance].expand((rel <= -max_distance).sum()))


CASES = [
    # batch, sq, sk, h, h_kv, d, dv, causal, window, softcap, sink, mask, max_distance, bidirectional
    (2, 37, 53, 4, 2, 16, 16, False, (-1, -1), 0.0, False, False, 128, True),
    (1, 70, 45, 2, 2, 8, 12, True, (-1, -1), 0.0, True, False, 16, True),
    (2, 33, 33, 2, 1, 16, 16, False, (9, 4), 2.5, False, True, 24, False),
    (1, 200, 260, 2, 2, 8, 8, True, (-1, -1), 0.0, False, False, 32, False),
    (1, 150, 150, 3, 1, 8, 8, False, (-1, -1), 1.5, True, True, 40, True),
    # <= 8 query rows: the CPU's decode path
    (2, 1, 300, 4, 2, 16, 16, False, (-1, -1), 0.0, True, False, 128, True),
    (1, 5, 77, 2, 1, 8, 8, True, (-1, -1), 3.0, False, True, 20, False),
]
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 5e-3}
# (device, dtype) of the comparisons: the CPU in three dtypes; CUDA in four (fp16 / bf16 on the float32 kernels:
# test_cuda_half_runs_float32_kernels)
DEVICE_DTYPES = [pytest.param("cpu", dt, id=f"cpu-{DTYPE_NAMES[dt]}")
                 for dt in (torch.float64, torch.float32, torch.bfloat16)] + [
                pytest.param("cuda", dt, id=f"cuda-{DTYPE_NAMES[dt]}", marks=requires_cuda)
                for dt in (torch.float64, torch.float32, torch.bfloat16, torch.float16)]
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


def make_case(case, dtype, seed):
    b, sq, sk, h, hkv, d, dv, causal, window, softcap, sink, mask, md, bidir = case
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, sq, h, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, sk, hkv, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, sk, hkv, dv, generator=g, dtype=torch.float64)
    table = torch.randn(h, 32 if md == 128 else 8, generator=g, dtype=torch.float64)
    s = torch.randn(h, generator=g, dtype=torch.float64) if sink else None
    m = torch.rand(b, 1, sq, sk, generator=g) > 0.2 if mask else None
    dout = torch.randn(b, sq, h, dv, generator=g, dtype=torch.float64)
    return q, k, v, table, s, m, dout


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"b{c[0]}-s{c[1]}x{c[2]}-h{c[3]}/{c[4]}-md{c[12]}-bi{c[13]}")
def test_against_reference(case, device, dtype):
    b, sq, sk, h, hkv, d, dv, causal, window, softcap, sink, mask, md, bidir = case
    q64, k64, v64, table64, sink64, m, dout = make_case(case, dtype, seed=sq * 7 + sk)
    lse_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    q, k, v = (x.to(device, dtype).requires_grad_() for x in (q64, k64, v64))
    table = table64.to(device, lse_dtype).requires_grad_()
    sk_t = sink64.to(device, lse_dtype).requires_grad_() if sink else None
    out, lse = flashattn_ext.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap, sink=sk_t,
                                             attn_mask=m.to(device) if m is not None else None, rel_bias=table,
                                             rel_bias_max_distance=md, rel_bias_bidirectional=bidir, return_lse=True)
    out.backward(dout.to(device, dtype))

    # the reference in float64 on the CPU from the rounded inputs, the bias as an additive mask (False -> -inf)
    qr, kr, vr = (x.detach().cpu().double().requires_grad_() for x in (q, k, v))
    tr = table.detach().cpu().double().requires_grad_()
    sr = sk_t.detach().cpu().double().requires_grad_() if sink else None
    bias = bias_matrix(tr, sq, sk, md, bidir).unsqueeze(0)
    if m is not None:
        bias = bias.masked_fill(~m, -math.inf)
    ref, ref_lse = attention_ref(qr, kr, vr, causal=causal, window_size=window, softcap=softcap, sink=sr,
                                 attn_mask=bias)
    ref.backward(dout)
    tol = TOL[dtype]
    scale = lambda x: max(1.0, x.abs().max().item())  # noqa: E731
    for name, got, want in (("out", out, ref), ("lse", lse, ref_lse), ("dq", q.grad, qr.grad),
                            ("dk", k.grad, kr.grad), ("dv", v.grad, vr.grad), ("drel_bias", table.grad, tr.grad)) + (
                           (("dsink", sk_t.grad, sr.grad),) if sink else ()):
        err = (got.detach().cpu().double() - want).abs().max().item() / scale(want)
        assert err < tol * (10 if name.startswith("d") and dtype == torch.bfloat16 else 1), (name, err)
    assert table.grad.abs().sum() > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bidirectional", [True, False])
def test_gradcheck(bidirectional, device):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 5, 2, 3, generator=g, dtype=torch.float64).to(device).requires_grad_()
    k = torch.randn(1, 7, 1, 3, generator=g, dtype=torch.float64).to(device).requires_grad_()
    v = torch.randn(1, 7, 1, 4, generator=g, dtype=torch.float64).to(device).requires_grad_()
    table = torch.randn(2, 8, generator=g, dtype=torch.float64).to(device).requires_grad_()

    def fn(q, k, v, table):
        return flashattn_ext.flash_attn_func(q, k, v, causal=True, softcap=1.5, rel_bias=table,
                                             rel_bias_max_distance=5, rel_bias_bidirectional=bidirectional)
    assert torch.autograd.gradcheck(fn, (q, k, v, table))


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_half_table_grad_from_unrounded_out(device, dtype, varlen):
    """fp16 / bf16 run rel_bias on float32 copies (CPU and CUDA): the forward's float32 out (out32), not the rounded
    one, gives the backward's delta = rowsum(dout * out). The table's gradient sums dS over whole rows, whose exact
    sums cancel; here (3 keys, 89 queries: nearly every entry in bucket 0 or 1, softcap) the rounded out's delta
    leaves the bf16 table gradient 3.0% of its largest entry from the float64 one (test_fuzz rel_bias seed 61 on
    CUDA before out32 there), a float64 emulation of that rounding 3.05%; with out32 it is the float32 kernel's."""
    g = torch.Generator().manual_seed(61)
    sq, sk, h, d, dv, md = 89, 3, 2, 26, 32, 174
    q64 = torch.randn(1, sq, h, d, generator=g, dtype=torch.float64)
    k64 = torch.randn(1, sk, h, d, generator=g, dtype=torch.float64)
    v64 = torch.randn(1, sk, h, dv, generator=g, dtype=torch.float64)
    dout = torch.randn(1, sq, h, dv, generator=g, dtype=torch.float64).to(dtype)
    table64 = torch.randn(h, 8, generator=g, dtype=torch.float64)
    q, k, v = (x.to(device, dtype).requires_grad_() for x in (q64, k64, v64))
    table = table64.to(device, torch.float32).requires_grad_()
    kw = dict(softcap=8.84, rel_bias=table, rel_bias_max_distance=md, rel_bias_bidirectional=False)
    if varlen:
        cq = torch.tensor([0, sq], dtype=torch.int32, device=device)
        ck = torch.tensor([0, sk], dtype=torch.int32, device=device)
        out = flashattn_ext.flash_attn_varlen_func(q[0], k[0], v[0], cq, ck, sq, sk, **kw).unsqueeze(0)
    else:
        out = flashattn_ext.flash_attn_func(q, k, v, **kw)
    out.backward(dout.to(device))
    qr, kr, vr = (x.detach().cpu().double().requires_grad_() for x in (q, k, v))
    tr = table.detach().cpu().double().requires_grad_()
    ref, _ = attention_ref(qr, kr, vr, softcap=8.84, attn_mask=bias_matrix(tr, sq, sk, md, False).unsqueeze(0))
    ref.backward(dout.double())
    want = tr.grad
    assert want.abs().max() > 1.0  # the case's cancellation: entries of size 3 from sums of 89 rows
    err = (table.grad.cpu().double() - want).abs().max().item() / want.abs().max().item()
    assert err < 1e-4, err


@pytest.mark.parametrize("device", DEVICES)
def test_float32_table_with_float64_inputs(device):
    """A float32 table with float64 inputs is cast (differentiably): its gradient comes back in float32."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 9, 2, 4, generator=g, dtype=torch.float64)
    table = torch.randn(2, 8, generator=g, dtype=torch.float32).to(device).requires_grad_()
    out = flashattn_ext.flash_attn_func(*(q.to(device),) * 3, rel_bias=table, rel_bias_max_distance=10)
    ref, _ = attention_ref(q, q, q, attn_mask=bias_matrix(table.detach().cpu().double(), 9, 9, 10, True).unsqueeze(0))
    assert (out.cpu() - ref).abs().max() < 1e-6
    out.sum().backward()
    assert table.grad.dtype == torch.float32 and table.grad.abs().sum() > 0


def test_refusals():
    q = torch.randn(1, 4, 2, 8)
    table = torch.randn(2, 8)
    call = lambda **kw: flashattn_ext.flash_attn_func(q, q, q, **kw)  # noqa: E731
    with pytest.raises(ValueError, match="rel_bias and alibi_slopes"):
        call(rel_bias=table, alibi_slopes=torch.ones(2))
    with pytest.raises(ValueError, match=r"rel_bias must have shape \(nheads, num_buckets\) = \(2, n\)"):
        call(rel_bias=torch.randn(3, 8))
    with pytest.raises(TypeError, match="rel_bias must be a floating-point tensor"):
        call(rel_bias=torch.ones(2, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match="rel_bias_max_distance must exceed the exact buckets"):
        call(rel_bias=table, rel_bias_max_distance=2)
    with pytest.raises(ValueError, match="rel_bias needs num_buckets >= 4"):
        call(rel_bias=torch.randn(2, 3))
    with pytest.raises(TypeError, match="rel_bias_max_distance must be an int"):
        call(rel_bias=table, rel_bias_max_distance=12.0)
    with pytest.raises(TypeError, match="rel_bias_bidirectional must be a bool"):
        call(rel_bias=table, rel_bias_bidirectional=1)
    with pytest.raises(ValueError, match="return_attn_probs is not supported with rel_bias"):
        call(rel_bias=table, return_attn_probs=True)
    with pytest.raises(RuntimeError, match="rel_bias and rel_buckets go together"):
        torch.ops.flashattn_ext.fwd(q, q, q, 0.5, False, True, -1, -1, 0.0, None, None, None, 0.0, False, table)
    with pytest.raises(RuntimeError, match=r"rel_buckets must hold buckets in \[0, num_buckets = 8\)"):
        torch.ops.flashattn_ext.fwd(q, q, q, 0.5, False, True, -1, -1, 0.0, None, None, None, 0.0, False, table,
                                    torch.tensor([0, 8, 1], dtype=torch.int32))


def test_double_backward_and_lse_gradient_raise():
    q = torch.randn(1, 4, 2, 8, dtype=torch.float64, requires_grad=True)
    table = torch.randn(2, 8, dtype=torch.float64, requires_grad=True)
    out, lse = flashattn_ext.flash_attn_func(q, q, q, rel_bias=table, return_lse=True)
    (g,) = torch.autograd.grad(out.sum(), q, retain_graph=True)  # first order: fine
    assert torch.isfinite(g).all()
    with pytest.raises(NotImplementedError, match="double backward"):
        torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(NotImplementedError, match="the gradient of lse"):
        torch.autograd.grad(lse.sum(), q)


HALF_ON_FP32 = """
import warnings, torch, flashattn_ext
dtype = getattr(torch, "{dtype}")
q = torch.randn(1, 40, 2, 64, device="cuda", dtype=dtype, requires_grad=True)
table = torch.randn(2, 32, device="cuda", requires_grad=True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = flashattn_ext.flash_attn_func(q, q, q, rel_bias=table, causal=True)
    out.sum().backward()
print("KERNELS", flashattn_ext._C.last_cuda_kernels(), out.dtype, q.grad.dtype, table.grad.dtype)
print("WARNINGS", [str(w.message).split(" (Triggered")[0] for w in caught])
"""


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_cuda_half_runs_float32_kernels(dtype):
    """fp16 / bf16 on CUDA run rel_bias on the float32 kernels (ops_cuda.cpp half_on_fp32): the kernel report names
    the simple kernels, out and the gradients come back in the inputs' dtype (the table's in float32), one warning per
    direction naming rel_bias; the varlen function and the module take it too (values: test_against_reference,
    test_varlen_against_reference)."""
    proc = run_python(["-c", HALF_ON_FP32.format(dtype=str(dtype).split(".")[1])])
    assert proc.returncode == 0, proc.stderr[-2000:]
    name = str(dtype)
    assert f"KERNELS ('simple.cu', 'simple.cu') {name} {name} torch.float32" in proc.stdout, proc.stdout
    warned = proc.stdout.split("WARNINGS", 1)[1]
    assert warned.count("T5's rel_bias with float16 / bfloat16 inputs has no tensor-core kernel") == 2, warned
    q = torch.randn(1, 4, 2, 64, device="cuda", dtype=dtype)
    cu = torch.tensor([0, 1, 4], dtype=torch.int32, device="cuda")
    table = torch.randn(2, 32, device="cuda")
    out = flashattn_ext.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 3, 3, rel_bias=table)
    assert out.dtype == dtype and torch.isfinite(out).all()
    attn = flashattn_ext.nn.Attention(128, 2, rel_bias_buckets=8, device="cuda", dtype=dtype)
    y = attn(torch.randn(1, 4, 128, device="cuda", dtype=dtype))
    assert y.dtype == dtype and torch.isfinite(y).all()


@requires_cuda
def test_cuda_deterministic():
    """The CUDA backward with rel_bias is bitwise reproducible (no atomics; the table's partials summed in a fixed
    order), GQA, varlen-free, dropout-free."""
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, 97, h, 24, generator=g).cuda().requires_grad_() for h in (4, 2, 2))
    table = torch.randn(4, 32, generator=g).cuda().requires_grad_()
    runs = []
    for _ in range(2):
        out = flashattn_ext.flash_attn_func(q, k, v, causal=True, softcap=4.0, rel_bias=table,
                                            rel_bias_max_distance=40)
        runs.append((out.detach(),) + torch.autograd.grad(out.square().sum(), (q, k, v, table)))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@requires_cuda
def test_cuda_buckets_clamped():
    """The CUDA binding does not read rel_buckets on the host (no sync): entries outside [0, num_buckets) are
    clamped by the kernels (memory-safe), where the CPU binding raises (test_refusals)."""
    q = torch.randn(1, 3, 2, 8, device="cuda")
    table = torch.randn(2, 8, device="cuda")

    def fwd(buckets):  # relative positions -2 .. 2
        buckets = torch.tensor(buckets, dtype=torch.int32, device="cuda")
        return torch.ops.flashattn_ext.fwd(q, q, q, 0.5, False, True, -1, -1, 0.0, None, None, None, 0.0, False, table,
                                           buckets)[0]
    assert torch.equal(fwd([0, 100, 1, -5, 2]), fwd([0, 7, 1, 0, 2]))


@requires_cuda
@pytest.mark.parametrize("causal", [True, False])
def test_cuda_module(causal):
    """nn.Attention(rel_bias_buckets=...) in float32 / float64 on CUDA equals the same module on the CPU: output and
    the gradients of x and the table (a float32 parameter: 1e-6 in float64, its rounding)."""
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-5)):
        torch.manual_seed(0)
        attn = flashattn_ext.nn.Attention(64, 4, num_kv_heads=2, causal=causal, rel_bias_buckets=16,
                                          rel_bias_max_distance=30, dtype=dtype)
        with torch.no_grad():
            attn.rel_bias.normal_()
        x = torch.randn(2, 75, 64, dtype=dtype)
        results = []
        for device in ("cpu", "cuda"):
            m = attn.to(device)
            m.zero_grad()
            xd = x.detach().to(device).requires_grad_()
            y = m(xd)
            y.backward(torch.ones_like(y))
            results.append([t.detach().cpu().double() for t in (y, xd.grad, m.rel_bias.grad)])
        for name, got, want, t in zip(("y", "dx", "drel_bias"), results[1], results[0], (tol, tol, max(tol, 1e-6))):
            assert (got - want).abs().max() <= t * max(1.0, want.abs().max().item()), name


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("bidirectional,causal", [(True, False), (False, True)])
def test_varlen_against_reference(device, dtype, bidirectional, causal):
    """flash_attn_varlen_func with rel_bias: each sequence equals the reference on it alone (its own i'), the
    table's gradient the sum over the sequences; a zero-length sequence and seqlen_q > seqlen_k included."""
    g = torch.Generator().manual_seed(11)
    lens_q, lens_k = [5, 0, 90, 33], [7, 4, 70, 33]
    h, hkv, d, md = 4, 2, 8, 24
    lse_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    q64 = torch.randn(sum(lens_q), h, d, generator=g, dtype=torch.float64)
    k64 = torch.randn(sum(lens_k), hkv, d, generator=g, dtype=torch.float64)
    v64 = torch.randn(sum(lens_k), hkv, d, generator=g, dtype=torch.float64)
    table64 = torch.randn(h, 12, generator=g, dtype=torch.float64)
    dout = torch.randn(sum(lens_q), h, d, generator=g, dtype=torch.float64)
    cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), dtype=torch.int32)
    q, k, v = (x.to(device, dtype).requires_grad_() for x in (q64, k64, v64))
    table = table64.to(device, lse_dtype).requires_grad_()
    out = flashattn_ext.flash_attn_varlen_func(q, k, v, cu_q.to(device), cu_k.to(device), max(lens_q), max(lens_k),
                                               causal=causal, rel_bias=table, rel_bias_max_distance=md,
                                               rel_bias_bidirectional=bidirectional)
    out.backward(dout.to(device, dtype))
    tr = table.detach().cpu().double().requires_grad_()
    qr, kr, vr = (x.detach().cpu().double().requires_grad_() for x in (q, k, v))
    refs = []
    for s, (sq, sk) in enumerate(zip(lens_q, lens_k)):
        qs, ks, vs = qr[cu_q[s]:cu_q[s + 1]], kr[cu_k[s]:cu_k[s + 1]], vr[cu_k[s]:cu_k[s + 1]]
        if sq == 0:
            continue
        bias = bias_matrix(tr, sq, sk, md, bidirectional).unsqueeze(0)
        ref, _ = attention_ref(qs[None], ks[None], vs[None], causal=causal, attn_mask=bias)
        refs.append(ref[0])
    ref = torch.cat(refs)
    ref.backward(dout)
    tol = TOL[dtype] * (1 if dtype == torch.float64 else 10)
    for name, got, want in (("out", out, ref), ("dq", q.grad, qr.grad), ("dk", k.grad, kr.grad),
                            ("dv", v.grad, vr.grad), ("drel_bias", table.grad, tr.grad)):
        err = (got.detach().cpu().double() - want).abs().max().item() / max(1.0, want.abs().max().item())
        assert err < tol, (name, err)


def test_varlen_double_backward_raises():
    q = torch.randn(6, 2, 4, dtype=torch.float64, requires_grad=True)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    table = torch.randn(2, 8, dtype=torch.float64, requires_grad=True)
    out = flashattn_ext.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, rel_bias=table)
    with pytest.raises(NotImplementedError, match="double backward"):
        torch.autograd.grad(out.sum(), q, create_graph=True)


def test_torch_compile_fullgraph():
    """One graph (fullgraph) for a call with rel_bias, forward and backward equal to eager."""
    g = torch.Generator().manual_seed(21)
    q = torch.randn(1, 16, 2, 8, generator=g, requires_grad=True)
    table = torch.randn(2, 8, generator=g, requires_grad=True)
    fn = lambda q, t: flashattn_ext.flash_attn_func(q, q, q, rel_bias=t, rel_bias_max_distance=10)  # noqa: E731
    out = torch.compile(fn, fullgraph=True)(q, table)
    (gq, gt) = torch.autograd.grad(out.sum(), (q, table))
    want = fn(q, table)
    (wq, wt) = torch.autograd.grad(want.sum(), (q, table))
    assert torch.equal(out, want) and torch.equal(gq, wq) and torch.equal(gt, wt)
