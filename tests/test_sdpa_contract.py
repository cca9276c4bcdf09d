"""flashattn_ext.scaled_dot_product_attention against torch.nn.functional.scaled_dot_product_attention
side by side in float64: any rank (2-D to 6-D), batch dims broadcast between query, key, value and
attn_mask (a 1-D mask too, which torch rejects: compared as the (1, seqlen_k) mask it broadcasts as), head
counts broadcast (or enable_gqa, key and value heads differing too), headdim_v != headdim, any strides (last
stride != 1 included), empty batches; the output and the gradients of query, key, value and a float mask
(a broadcast input's gradient summed over its broadcast dims as torch sums it). Broadcast inputs reach
the kernel as views of the caller's storage (no expanded copy), the batch dims flattened into one call
where the strides allow it. Other shapes torch rejects raise, naming the argument."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn_ext
import flashattn_ext.interface as interface
from fa_testing import DEVICES

TOL = dict(atol=1e-12, rtol=1e-10)

# (query, key, value, attn_mask or None, kwargs): shapes as torch takes them
CASES = {
    "2d": ((5, 8), (7, 8), (7, 8), None, {}),
    "2d-mask": ((5, 8), (7, 8), (7, 8), (5, 7), {}),
    "2d-mask-1d": ((5, 8), (7, 8), (7, 8), (7,), {}),
    "3d": ((3, 5, 8), (3, 7, 8), (3, 7, 8), None, {}),
    "3d-bcast-kv": ((3, 5, 8), (1, 7, 8), (1, 7, 8), (3, 5, 7), {}),
    "4d-bcast-batch-q": ((1, 2, 5, 8), (3, 2, 7, 8), (3, 2, 7, 8), None, {}),
    "5d": ((2, 3, 2, 5, 8), (2, 3, 2, 7, 8), (2, 3, 2, 7, 8), None, {}),
    "5d-bcast-k-v": ((2, 3, 2, 5, 8), (2, 1, 2, 7, 8), (1, 3, 2, 7, 8), None, {}),
    "5d-bcast-inner": ((3, 2, 2, 5, 8), (3, 1, 2, 7, 8), (3, 1, 2, 7, 8), (3, 2, 1, 5, 7), {}),
    "5d-mask-bcast": ((2, 3, 2, 5, 8), (2, 3, 2, 7, 8), (2, 3, 2, 7, 8), (2, 1, 1, 5, 7), {}),
    "5d-mask-2d": ((2, 3, 2, 5, 8), (3, 2, 7, 8), (3, 2, 7, 8), (5, 7), {}),
    "5d-mask-1d": ((2, 3, 2, 5, 8), (2, 3, 2, 7, 8), (2, 3, 2, 7, 8), (7,), {}),
    "5d-causal": ((2, 3, 2, 6, 8), (2, 1, 2, 5, 8), (2, 1, 2, 5, 8), None, {"is_causal": True}),
    "6d": ((2, 1, 3, 2, 5, 8), (1, 2, 3, 2, 7, 8), (2, 2, 1, 2, 7, 8), (2, 1, 3, 1, 5, 7), {}),
    "mixed-rank": ((2, 3, 4, 5, 8), (4, 7, 8), (3, 4, 7, 8), (3, 1, 5, 7), {}),
    "heads-bcast-kv": ((2, 4, 5, 8), (2, 1, 7, 8), (2, 1, 7, 8), None, {}),
    "heads-bcast-k": ((2, 4, 5, 8), (2, 1, 7, 8), (2, 4, 7, 8), None, {}),
    "heads-bcast-q": ((2, 1, 5, 8), (2, 4, 7, 8), (2, 4, 7, 8), (2, 4, 5, 7), {}),
    "gqa": ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), (1, 4, 5, 7), {"enable_gqa": True}),
    "gqa-k2-v4": ((2, 8, 5, 8), (2, 2, 7, 8), (2, 4, 7, 8), None, {"enable_gqa": True}),
    "gqa-3d-bcast": ((2, 8, 5, 8), (1, 2, 7, 8), (1, 2, 7, 8), None, {"enable_gqa": True, "is_causal": True}),
    "headdim-v-larger": ((2, 2, 5, 8), (2, 2, 7, 8), (2, 2, 7, 12), (2, 1, 5, 7), {}),
    "headdim-v-smaller": ((2, 2, 5, 8), (2, 2, 7, 8), (2, 2, 7, 3), None, {"scale": 0.3}),
    "empty-batch": ((0, 2, 5, 8), (1, 2, 7, 8), (1, 2, 7, 8), None, {}),
}
# per case: how many kernel calls, 1 where not listed: a broadcast batch dim next to a real one does not
# flatten into one, so the kernel runs once per index of the batch dims outside the largest run that does
CALLS = {"5d-bcast-k-v": 2, "5d-bcast-inner": 2, "5d-mask-bcast": 2, "5d-mask-2d": 2, "5d-causal": 2, "6d": 4, "mixed-rank": 2}
# cases whose inputs the kernel sees as views of the caller's tensors (no copy needed)
NEEDS_COPY = {"gqa-k2-v4", "headdim-v-larger", "headdim-v-smaller"}
LAYOUTS = ["contiguous", "transposed", "last-stride-2"]


def leaf(shape, gen, device, layout, dtype=torch.float64):
    """A float64 leaf of shape in layout: contiguous, its last two dims swapped in memory, or every other
    element of its last dim (stride 2)."""
    shape = tuple(shape)
    if layout == "transposed" and len(shape) >= 2:
        data = torch.randn(*shape[:-2], shape[-1], shape[-2], generator=gen, dtype=torch.float64)
        return data.to(device, dtype).transpose(-1, -2).requires_grad_()
    if layout == "last-stride-2":
        data = torch.randn(*shape[:-1], 2 * shape[-1], generator=gen, dtype=torch.float64).to(device, dtype)
        base = data.requires_grad_()
        return base[..., ::2]
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(device, dtype).requires_grad_()


def case_inputs(case, device, layout, mask_kind="float"):
    q_shape, k_shape, v_shape, m_shape, kwargs = CASES[case]
    gen = torch.Generator().manual_seed(sum(map(ord, case)))
    q, k, v = (leaf(s, gen, device, layout) for s in (q_shape, k_shape, v_shape))
    mask = None
    if m_shape is not None:
        if mask_kind == "bool":
            hidden = torch.rand(m_shape, generator=gen) < 0.3
            hidden[..., 0] = False
            mask = (~hidden).to(device)
        else:
            mask = leaf(m_shape, gen, device, layout)
    return q, k, v, mask, kwargs


def torch_sdpa(q, k, v, attn_mask=None, **kwargs):
    """torch's SDPA; a 1-D mask (which torch rejects and flashattn_ext broadcasts) as the 2-D (1, seqlen_k)
    it broadcasts as."""
    if attn_mask is not None and attn_mask.dim() == 1:
        attn_mask = attn_mask[None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kwargs)


def run(fn, q, k, v, mask, kwargs):
    """fn's output and the gradients (None where an input does not require grad) for a fixed upstream
    gradient."""
    out = fn(q, k, v, attn_mask=mask, **kwargs)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    inputs = [t for t in (q, k, v, mask) if t is not None and t.requires_grad]
    if not out.numel():
        return out, [None] * len(inputs)
    return out, torch.autograd.grad(out, inputs, dout.to(out.device, out.dtype))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_matches_torch(device, case, layout):
    q, k, v, mask, kwargs = case_inputs(case, device, layout)
    out, grads = run(flashattn_ext.scaled_dot_product_attention, q, k, v, mask, kwargs)
    ref, ref_grads = run(torch_sdpa, q, k, v, mask, kwargs)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, **TOL)
    for name, g, r in zip(("query", "key", "value", "attn_mask"), grads, ref_grads):
        torch.testing.assert_close(g, r, msg=lambda m: f"grad of {name}: {m}", **TOL)


@pytest.mark.parametrize("case", ["5d-mask-bcast", "heads-bcast-q", "gqa", "2d-mask", "6d"])
@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_bool_mask_matches_torch(device, case):
    q, k, v, mask, kwargs = case_inputs(case, device, "contiguous", mask_kind="bool")
    out, grads = run(flashattn_ext.scaled_dot_product_attention, q, k, v, mask, kwargs)
    ref, ref_grads = run(torch_sdpa, q, k, v, mask, kwargs)
    torch.testing.assert_close(out, ref, **TOL)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **TOL)


@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_float32_mask_on_float64_inputs(device):
    """A float mask of another dtype is cast, as torch casts it; its gradient comes back in its dtype."""
    q, k, v, _, _ = case_inputs("5d", device, "contiguous")
    mask = torch.randn(2, 1, 1, 5, 7, generator=torch.Generator().manual_seed(2)).to(device).requires_grad_()
    out, grads = run(flashattn_ext.scaled_dot_product_attention, q, k, v, mask, {})
    ref, ref_grads = run(torch_sdpa, q, k, v, mask, {})
    torch.testing.assert_close(out, ref, **TOL)
    assert grads[3].dtype == torch.float32
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


def storage(t):
    return t.untyped_storage().data_ptr()


@pytest.mark.parametrize("case", [c for c in CASES if c not in NEEDS_COPY and c != "empty-batch"])
def test_sdpa_passes_views(monkeypatch, case):
    """The kernel gets views of the caller's tensors (a broadcast one with stride 0, never an expanded
    copy), in one call unless the batch dims' strides cannot flatten into one (then once per index of
    the others, CALLS)."""
    q, k, v, mask, kwargs = case_inputs(case, "cpu", "contiguous")
    calls, real = [], interface._attention

    def spy(q_, k_, v_, *args):
        calls.append((q_, k_, v_, args[7]))
        return real(q_, k_, v_, *args)

    monkeypatch.setattr(interface, "_attention", spy)
    flashattn_ext.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)
    assert len(calls) == CALLS.get(case, 1)
    for got in calls:
        for name, t, src in zip(("query", "key", "value", "attn_mask"), got, (q, k, v, mask)):
            assert (t is None) == (src is None)
            if t is not None:
                assert storage(t) == storage(src), f"{name} was copied"


def test_sdpa_output_layout():
    """(..., nheads, seqlen_q, headdim_v) as a transposed view of a (..., seqlen_q, nheads, headdim_v)
    tensor, as flash_attn_func's layout gives it."""
    q, k, v, _, _ = case_inputs("5d", "cpu", "contiguous")
    out = flashattn_ext.scaled_dot_product_attention(q, k, v)
    assert out.shape == (2, 3, 2, 5, 8) and out.transpose(-3, -2).is_contiguous()


# (query, key, value, attn_mask, kwargs, words the message names): shapes torch rejects too
BAD = [
    ((5,), (7, 8), (7, 8), None, {}, ("query", "2 dimensions")),
    ((2, 5, 8), (2, 7, 8), (7,), None, {}, ("value", "2 dimensions")),
    ((5, 8), (7, 8), (7, 8), None, {"enable_gqa": True}, ("query", "3 dimensions", "enable_gqa")),
    ((2, 2, 5, 8), (2, 2, 7, 6), (2, 2, 7, 6), None, {}, ("key", "head dim")),
    ((2, 2, 5, 8), (3, 2, 7, 8), (3, 2, 7, 8), None, {}, ("batch", "broadcast")),
    ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), None, {}, ("nheads", "enable_gqa")),
    ((2, 4, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), None, {"enable_gqa": True}, ("nheads", "divide")),
    ((2, 1, 5, 8), (2, 4, 7, 8), (2, 4, 7, 8), None, {"enable_gqa": True}, ("nheads", "divide")),
    ((2, 2, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), (1, 2, 2, 5, 7), {}, ("attn_mask", "dimensions")),
    ((1, 2, 5, 8), (1, 2, 7, 8), (1, 2, 7, 8), (2, 2, 5, 7), {}, ("attn_mask", "broadcast")),
    ((2, 1, 5, 8), (2, 1, 7, 8), (2, 1, 7, 8), (2, 2, 5, 7), {}, ("attn_mask", "broadcast")),
    ((2, 2, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), (5, 7), {"is_causal": True}, ("attn_mask", "is_causal")),
]


@pytest.mark.parametrize("q_shape, k_shape, v_shape, m_shape, kwargs, words", BAD, ids=[str(b[:4]) for b in BAD])
def test_sdpa_rejects_what_torch_rejects(q_shape, k_shape, v_shape, m_shape, kwargs, words):
    q, k, v = (torch.randn(s, dtype=torch.float64) for s in (q_shape, k_shape, v_shape))
    mask = None if m_shape is None else torch.zeros(m_shape, dtype=torch.float64)
    # torch's math backend: the contract (before 2.14 the CPU's default kernel took attn_mask with is_causal=True,
    # top-left causal on the mask, where the math backend and every backend since raise)
    with pytest.raises((RuntimeError, IndexError)), sdpa_kernel(SDPBackend.MATH):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)
    pattern = "(?is)^" + "".join(f"(?=.*{w})" for w in words)
    with pytest.raises((ValueError, RuntimeError), match=pattern):
        flashattn_ext.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)


def test_sdpa_rejects_key_value_seqlen_mismatch():
    """key and value of different lengths: an error naming both (torch's CPU kernels do not always check)."""
    q, k, v = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 6, 8)
    with pytest.raises(ValueError, match="(?s)seqlen of key.*value"):
        flashattn_ext.scaled_dot_product_attention(q, k, v)


def test_sdpa_rejects_integer_mask():
    q = torch.randn(2, 2, 5, 8)
    with pytest.raises(TypeError, match="attn_mask"):
        flashattn_ext.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(5, 5, dtype=torch.int64))


@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_fully_masked_rows_as_torch(device):
    """A row whose keys are all masked (bool False, or float -inf): 0, as torch 2.14 gives (every backend),
    and zero gradients there."""
    q, k, v, _, _ = case_inputs("5d", device, "contiguous")
    keep = torch.ones(5, 7, dtype=torch.bool, device=device)
    keep[1] = False
    for mask in (keep, torch.zeros(5, 7, dtype=torch.float64, device=device).masked_fill(~keep, -math.inf)):
        out, grads = run(flashattn_ext.scaled_dot_product_attention, q, k, v, mask, {})
        ref, ref_grads = run(torch_sdpa, q, k, v, mask, {})
        assert (out[..., 1, :] == 0).all()
        torch.testing.assert_close(out, ref, **TOL)
        assert (grads[0][..., 1, :] == 0).all()
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g, r, **TOL)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_sdpa_broadcast_under_compile(dynamic):
    """torch.compile(fullgraph=True) traces the broadcasting and the per-index calls (no graph break),
    with static and symbolic shapes; the compiled result is torch's."""
    torch._dynamo.reset()
    compiled = torch.compile(flashattn_ext.scaled_dot_product_attention, fullgraph=True, backend="aot_eager",
                             dynamic=dynamic)
    q, k, v, mask, kwargs = case_inputs("5d-mask-bcast", "cpu", "contiguous")
    out, grads = run(compiled, q, k, v, mask, kwargs)
    ref, ref_grads = run(torch_sdpa, q, k, v, mask, kwargs)
    torch.testing.assert_close(out, ref, **TOL)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **TOL)
