"""merge_attention_states against attention over the union of the two key sets (float64 reference),
rows where one or both sides saw no key, gradients (gradcheck in float64), CPU and CUDA."""
import pytest
import torch

import flashattn_ext
from fa_testing import DEVICES, attention64

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
    with pytest.raises(TypeError, match="lse_a"):
        flashattn_ext.merge_attention_states(o, torch.zeros(1, 2, 3, dtype=torch.int64), o, lse)
