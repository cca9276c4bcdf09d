"""flashattn_ext.nn: MultiheadAttention against torch.nn.MultiheadAttention with the same state dict
(outputs, attention weights averaged and per head, and the gradients of the inputs and parameters through
both; every constructor option: bias, kdim / vdim, add_bias_kv, add_zero_attn, batch_first both ways;
unbatched, self-, key=value and separate cross-attention, key_padding_mask, attn_mask (2-D and per-head
3-D, bool and float), is_causal, dropout (the weights returned are those the kernel used)), state dicts
both ways for every option, initialization, errors, and the module inside
torch.nn.TransformerEncoderLayer; Attention (GQA, rotary, causal, window, softcap, masks) against the
same projections around an eager attention core. CPU in float32 and float64, CUDA in float32."""
import math

import pytest
import torch

import flashattn_ext.nn as fnn
from fa_testing import HAS_CUDA

EMBED, HEADS = 32, 4
BATCH, SEQ_Q, SEQ_K = 3, 7, 9
PADDED_KEYS = (0, 2, 5)  # per batch row: this many keys at the end are padding (key 0 never is)
DEVICE_DTYPES = [
    pytest.param("cpu", torch.float32, id="cpu-fp32"),
    pytest.param("cpu", torch.float64, id="cpu-fp64"),
    pytest.param("cuda", torch.float32, id="cuda-fp32",
                 marks=[pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")]),
]
# torch's own warning when key_padding_mask and attn_mask differ in type (bool and float): we test that case
pytestmark = pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask:UserWarning")
TOL = {torch.float64: dict(atol=1e-10, rtol=1e-10), torch.float32: dict(atol=2e-5, rtol=1e-4)}
# every constructor option of torch.nn.MultiheadAttention that shapes the parameters or the keys
OPTIONS = {
    "default": {},
    "no_bias": dict(bias=False),
    "kdim_vdim": dict(kdim=EMBED // 2, vdim=EMBED + 8),
    "kdim_eq_vdim": dict(kdim=EMBED // 2, vdim=EMBED // 2),
    "bias_kv": dict(add_bias_kv=True),
    "zero_attn": dict(add_zero_attn=True),
    "bias_kv_zero_attn": dict(add_bias_kv=True, add_zero_attn=True),
    "all": dict(bias=False, kdim=EMBED // 2, vdim=EMBED // 4, add_bias_kv=True, add_zero_attn=True),
}
WEIGHTS = {"no_weights": dict(need_weights=False), "averaged": {}, "per_head": dict(average_attn_weights=False)}


def kinds(options):
    """The input kinds an option allows: self-attention needs kdim = vdim = embed_dim, key is value
    needs kdim = vdim."""
    kdim, vdim = options.get("kdim", EMBED), options.get("vdim", EMBED)
    allowed = {"self": kdim == vdim == EMBED, "kv": kdim == vdim, "cross": True}
    return [kind for kind, ok in allowed.items() if ok]


CASES = [pytest.param(name, kind, id=f"{name}-{kind}") for name, options in OPTIONS.items() for kind in kinds(options)]


def mha_pair(device, dtype, seed=0, **kwargs):
    """(ours, torch's) MultiheadAttention with torch's weights loaded into ours; dropout 0, train mode."""
    torch.manual_seed(seed)
    ref = torch.nn.MultiheadAttention(EMBED, HEADS, device=device, dtype=dtype, **kwargs)
    with torch.no_grad():  # biases start at zero: make them matter
        for p in ref.parameters():
            if p.dim() == 1:
                p.normal_()
    ours = fnn.MultiheadAttention(EMBED, HEADS, device=device, dtype=dtype, **kwargs)
    ours.load_state_dict(ref.state_dict())
    return ours, ref


def key_padding(device, float_mask=False, dtype=torch.float32):
    """(BATCH, SEQ_K), torch's convention: True (or -inf) = padding, PADDED_KEYS at the end of each row."""
    pad = torch.zeros(BATCH, SEQ_K, dtype=torch.bool, device=device)
    for row, n in enumerate(PADDED_KEYS):
        if n:
            pad[row, -n:] = True
    if float_mask:
        return torch.zeros(pad.shape, dtype=dtype, device=device).masked_fill(pad, -math.inf)
    return pad


def attention_mask(kind, per_head, seqlen_q, seqlen_k, device, dtype, seed=3):
    """torch's convention: bool True = not attended (key 0 always attended, so no row is empty), or a
    float additive mask of random values with some -inf; (L, S) or (BATCH * HEADS, L, S)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (BATCH * HEADS, seqlen_q, seqlen_k) if per_head else (seqlen_q, seqlen_k)
    hidden = torch.rand(shape, generator=gen) < 0.4
    hidden[..., 0] = False
    if kind == "bool":
        return hidden.to(device)
    return torch.randn(shape, generator=gen, dtype=torch.float64).masked_fill(hidden, -math.inf).to(device, dtype)


def inputs(kind, batch_first, device, dtype, seed=1, kdim=EMBED, vdim=EMBED):
    """(query, key, value) with grads: kind "self" (one tensor), "kv" (key is value), "cross" (three)."""
    gen = torch.Generator().manual_seed(seed)

    def make(seqlen, dim):
        shape = (BATCH, seqlen, dim) if batch_first else (seqlen, BATCH, dim)
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(device, dtype).requires_grad_()

    if kind == "self":
        x = make(SEQ_Q, EMBED)
        return x, x, x
    q, k = make(SEQ_Q, EMBED), make(SEQ_K, kdim)
    return (q, k, k) if kind == "kv" else (q, k, make(SEQ_K, vdim))


def run(module, query, key, value, need_weights=False, **kwargs):
    """Output, attention weights (None without need_weights) and the gradients of (the distinct) inputs
    and of the parameters, for fixed random upstream gradients of the output and of the weights."""
    for t in (query, key, value):
        t.grad = None
    module.zero_grad(set_to_none=True)
    out, weights = module(query, key, value, need_weights=need_weights, **kwargs)
    assert (weights is None) == (not need_weights)
    gen = torch.Generator().manual_seed(9)
    loss = (out * torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.device, out.dtype)).sum()
    if weights is not None:
        dw = torch.randn(weights.shape, generator=gen, dtype=torch.float64).to(out.device, out.dtype)
        loss = loss + (weights * dw).sum()
    loss.backward()
    grads = {f"input{i}": t.grad for i, t in enumerate(dict.fromkeys((query, key, value)))}
    grads.update({name: p.grad for name, p in module.named_parameters()})
    return out.detach(), None if weights is None else weights.detach(), grads


def assert_same(got, ref, dtype):
    out, weights, grads = got
    ref_out, ref_weights, ref_grads = ref
    torch.testing.assert_close(out, ref_out, **TOL[dtype])
    torch.testing.assert_close(weights, ref_weights, **TOL[dtype])
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], msg=lambda m: f"grad {name}: {m}", **TOL[dtype])


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize("option, kind", CASES)
@pytest.mark.parametrize("weights", list(WEIGHTS))
def test_mha_options(device, dtype, batch_first, option, kind, weights):
    """Every constructor option, both layouts, each input kind; the output, the weights (averaged, per
    head, or none) and the gradients through both."""
    options = OPTIONS[option]
    ours, ref = mha_pair(device, dtype, batch_first=batch_first, **options)
    q, k, v = inputs(kind, batch_first, device, dtype, kdim=ours.kdim, vdim=ours.vdim)
    kwargs = dict(WEIGHTS[weights], need_weights=WEIGHTS[weights].get("need_weights", True))
    assert_same(run(ours, q, k, v, **kwargs), run(ref, q, k, v, **kwargs), dtype)


def test_mha_need_weights_by_default():
    """mha(x, x, x) returns torch's averaged weights, as torch's default need_weights=True does."""
    ours, ref = mha_pair("cpu", torch.float64, batch_first=True)
    x = inputs("self", True, "cpu", torch.float64)[0].detach()
    out, weights = ours(x, x, x)
    ref_out, ref_weights = ref(x, x, x)
    assert weights.shape == (BATCH, SEQ_Q, SEQ_Q)
    torch.testing.assert_close(out, ref_out, **TOL[torch.float64])
    torch.testing.assert_close(weights, ref_weights, **TOL[torch.float64])


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("pad", [None, "bool", "float"])
@pytest.mark.parametrize("mask", [None, "bool-2d", "bool-3d", "float-2d", "float-3d"])
@pytest.mark.parametrize("option", ["default", "bias_kv_zero_attn"])
@pytest.mark.parametrize("need_weights", [False, True], ids=["no_weights", "weights"])
def test_mha_masks(device, dtype, pad, mask, option, need_weights):
    if pad is None and mask is None:
        pytest.skip("no mask: test_mha_options")
    ours, ref = mha_pair(device, dtype, batch_first=True, **OPTIONS[option])
    q, k, v = inputs("kv", True, device, dtype)
    kwargs = {"need_weights": need_weights, "average_attn_weights": False}
    if pad is not None:
        kwargs["key_padding_mask"] = key_padding(device, pad == "float", dtype)
    if mask is not None:
        kind, dims = mask.split("-")
        kwargs["attn_mask"] = attention_mask(kind, dims == "3d", SEQ_Q, SEQ_K, device, dtype)
    assert_same(run(ours, q, k, v, **kwargs), run(ref, q, k, v, **kwargs), dtype)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("pad", [False, True], ids=["no_pad", "pad"])
@pytest.mark.parametrize("need_weights", [False, True], ids=["no_weights", "weights"])
def test_mha_is_causal(device, dtype, pad, need_weights):
    """is_causal with torch's square causal mask as the hint; without the mask on ours alone."""
    ours, ref = mha_pair(device, dtype, batch_first=True)
    q = inputs("self", True, device, dtype)[0]
    causal = torch.nn.Transformer.generate_square_subsequent_mask(SEQ_Q, device=device, dtype=dtype)
    kwargs = {"key_padding_mask": key_padding(device)[:, :SEQ_Q]} if pad else {}
    kwargs["need_weights"] = need_weights
    expected = run(ref, q, q, q, attn_mask=causal, is_causal=True, **kwargs)
    assert_same(run(ours, q, q, q, attn_mask=causal, is_causal=True, **kwargs), expected, dtype)
    assert_same(run(ours, q, q, q, is_causal=True, **kwargs), expected, dtype)
    assert_same(run(ours, q, q, q, attn_mask=causal, **kwargs), expected, dtype)


@pytest.mark.parametrize("option", ["bias_kv", "zero_attn"])
def test_mha_is_causal_with_appended_keys(option):
    """With add_bias_kv / add_zero_attn, is_causal applies the causal mask as given, the appended keys
    visible to every query: torch's result wherever torch applies the mask (with weights or a padding
    mask); is_causal without a mask is the same."""
    dtype = torch.float64
    ours, ref = mha_pair("cpu", dtype, batch_first=True, **OPTIONS[option])
    q = inputs("self", True, "cpu", dtype)[0]
    causal = torch.nn.Transformer.generate_square_subsequent_mask(SEQ_Q, dtype=dtype)
    expected = run(ref, q, q, q, attn_mask=causal, is_causal=True, need_weights=True)
    for kwargs in (dict(attn_mask=causal), {}):
        for need_weights in (False, True):
            got = run(ours, q, q, q, is_causal=True, need_weights=need_weights, **kwargs)
            if need_weights:
                assert_same(got, expected, dtype)
            else:
                torch.testing.assert_close(got[0], expected[0], **TOL[dtype])


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize("option", ["default", "all"])
@pytest.mark.parametrize("weights", list(WEIGHTS))
def test_mha_unbatched(device, dtype, batch_first, option, weights):
    ours, ref = mha_pair(device, dtype, batch_first=batch_first, **OPTIONS[option])
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(SEQ_Q, EMBED, generator=gen, dtype=torch.float64).to(device, dtype).requires_grad_()
    k = torch.randn(SEQ_K, ours.kdim, generator=gen, dtype=torch.float64).to(device, dtype).requires_grad_()
    v = torch.randn(SEQ_K, ours.vdim, generator=gen, dtype=torch.float64).to(device, dtype).requires_grad_()
    pad = key_padding(device)[1]
    mask = attention_mask("bool", False, SEQ_Q, SEQ_K, device, dtype)
    per_head = attention_mask("float", True, SEQ_Q, SEQ_K, device, dtype)[:HEADS]
    kwargs = dict(WEIGHTS[weights], need_weights=WEIGHTS[weights].get("need_weights", True))
    for masks in ({}, {"key_padding_mask": pad, "attn_mask": mask}, {"attn_mask": per_head}):
        assert_same(run(ours, x, k, v, **masks, **kwargs), run(ref, x, k, v, **masks, **kwargs), dtype)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_mha_fully_masked_rows(device, dtype):
    """A query whose keys are all masked: output as torch's without weights (the out_proj bias alone), weights
    0 there (torch gives NaN output and weights with need_weights=True), finite gradients."""
    ours, ref = mha_pair(device, dtype, batch_first=True)
    q, k, v = inputs("kv", True, device, dtype)
    mask = attention_mask("bool", False, SEQ_Q, SEQ_K, device, dtype)
    mask[2] = True
    out, weights, grads = run(ours, q, k, v, need_weights=True, attn_mask=mask, average_attn_weights=False)
    ref_out, _, _ = run(ref, q, k, v, need_weights=False, attn_mask=mask)
    torch.testing.assert_close(out, ref_out, **TOL[dtype])
    assert (weights[:, :, 2] == 0).all()
    mask[2] = False  # torch's weights of the other rows, without the NaN row
    _, ref_weights, _ = run(ref, q, k, v, need_weights=True, attn_mask=mask, average_attn_weights=False)
    other = [i for i in range(SEQ_Q) if i != 2]
    torch.testing.assert_close(weights[:, :, other], ref_weights[:, :, other], **TOL[dtype])
    assert all(torch.isfinite(g).all() for g in grads.values())


def test_mha_dropout():
    """Training with dropout: the probability reaches the kernel (outputs change, seeded runs repeat,
    gradients finite), and the weights returned are the ones the kernel used: out_proj(weights @ v) is the
    output; eval mode: no dropout, torch's output."""
    ours, ref = mha_pair("cpu", torch.float64, dropout=0.5, batch_first=True)
    q = inputs("self", True, "cpu", torch.float64)[0]
    outs = []
    for _ in range(2):
        torch.manual_seed(5)
        outs.append(run(ours, q, q, q, need_weights=True, average_attn_weights=False))
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=0, rtol=0)
    out, weights, grads = outs[0]
    assert (weights == 0).any()  # dropped
    with torch.no_grad():
        v = torch.nn.functional.linear(q, ours.in_proj_weight[2 * EMBED:], ours.in_proj_bias[2 * EMBED:])
        heads = weights @ v.unflatten(-1, (HEADS, -1)).transpose(1, 2)  # (N, H, L, D)
        torch.testing.assert_close(ours.out_proj(heads.transpose(1, 2).flatten(-2)), out, **TOL[torch.float64])
    ours.eval(), ref.eval()
    with torch.no_grad():
        eval_out = ours(q, q, q)[0]
        torch.testing.assert_close(eval_out, ref(q, q, q)[0], **TOL[torch.float64])
    assert not torch.allclose(out, eval_out)
    assert all(torch.isfinite(g).all() for g in grads.values())


@pytest.mark.parametrize("option", list(OPTIONS))
def test_state_dict_both_ways_and_init(option):
    """For every constructor option: the same parameter names, shapes and order as torch's; one seed, one
    initialization; a state dict goes torch -> ours -> torch and gives the same results."""
    options = OPTIONS[option]
    torch.manual_seed(7)
    ref = torch.nn.MultiheadAttention(EMBED, HEADS, batch_first=True, dtype=torch.float64, **options)
    torch.manual_seed(7)
    ours = fnn.MultiheadAttention(EMBED, HEADS, batch_first=True, dtype=torch.float64, **options)
    ref_state, our_state = ref.state_dict(), ours.state_dict()
    assert list(our_state) == list(ref_state)
    for name in ref_state:  # one seed, one initialization
        assert torch.equal(our_state[name], ref_state[name]), name
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(torch.randn_like(p))
    back = torch.nn.MultiheadAttention(EMBED, HEADS, batch_first=True, dtype=torch.float64, **options)
    back.load_state_dict(ours.state_dict())
    again = fnn.MultiheadAttention(EMBED, HEADS, batch_first=True, dtype=torch.float64, **options)
    again.load_state_dict(back.state_dict())
    q, k, v = (t.detach() for t in inputs("cross", True, "cpu", torch.float64, kdim=ours.kdim, vdim=ours.vdim))
    with torch.no_grad():
        out, weights = ours(q, k, v)
        ref_out, ref_weights = back(q, k, v)
        torch.testing.assert_close(ref_out, out, **TOL[torch.float64])
        torch.testing.assert_close(ref_weights, weights, **TOL[torch.float64])
        torch.testing.assert_close(again(q, k, v)[0], out, atol=0, rtol=0)


def test_mha_errors():
    mha = fnn.MultiheadAttention(EMBED, HEADS, batch_first=True)
    x = torch.randn(BATCH, SEQ_Q, EMBED)
    with pytest.raises(ValueError, match="key_padding_mask must have shape"):
        mha(x, x, x, key_padding_mask=torch.zeros(BATCH, SEQ_Q + 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="attn_mask must have shape"):
        mha(x, x, x, attn_mask=torch.zeros(HEADS, SEQ_Q, SEQ_Q, dtype=torch.bool))
    with pytest.raises(TypeError, match="attn_mask must be bool or floating point"):
        mha(x, x, x, attn_mask=torch.zeros(SEQ_Q, SEQ_Q, dtype=torch.int64))
    kv = torch.randn(BATCH, SEQ_K, EMBED)
    with pytest.raises(ValueError, match="is_causal=True without attn_mask"):
        mha(x, kv, kv, is_causal=True)
    cross = fnn.MultiheadAttention(EMBED, HEADS, kdim=8, vdim=12, batch_first=True)
    for k, v in ((kv, kv), (torch.randn(BATCH, SEQ_K, 8), kv), (torch.randn(BATCH, SEQ_K, 8),
                                                                 torch.randn(BATCH, SEQ_K + 1, 12))):
        with pytest.raises(ValueError, match=r"\(E, kdim, vdim\) = \(32, 8, 12\)"):
            cross(x, k, v)
    nested = torch.nested.nested_tensor([torch.randn(SEQ_Q, EMBED), torch.randn(SEQ_K, EMBED)], layout=torch.jagged)
    with pytest.raises(ValueError, match="NestedTensor"):
        mha(nested, nested, nested)
    with pytest.raises(ValueError, match="divisible"):
        fnn.MultiheadAttention(EMBED, 5)


def test_inside_transformer_encoder_layer(monkeypatch):
    """Swapped into torch.nn.TransformerEncoderLayer, our forward runs in eval mode too (torch's fused
    inference path stays off) and gives the layer's output."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(EMBED, HEADS, dim_feedforward=64, dropout=0.0, batch_first=True).eval()
    x = torch.randn(BATCH, SEQ_Q, EMBED)
    pad = key_padding("cpu")[:, :SEQ_Q]
    with torch.no_grad():
        expected = layer(x, src_key_padding_mask=pad)
        ours = fnn.MultiheadAttention(EMBED, HEADS, batch_first=True)
        ours.load_state_dict(layer.self_attn.state_dict())
        layer.self_attn = ours.eval()
        calls, real = [], fnn._attention

        def spy(*args):
            calls.append(args)
            return real(*args)

        monkeypatch.setattr(fnn, "_attention", spy)
        got = layer(x, src_key_padding_mask=pad)
    assert len(calls) == 1
    valid = ~pad  # torch's fused path zeroes padded positions; compare the real ones
    torch.testing.assert_close(got[valid], expected[valid], **TOL[torch.float32])


class TorchCore(fnn.Attention):
    """The same module with an independent core: eager softmax attention on explicit masks, heads repeated
    for GQA, rows that see no key giving 0."""

    def attend(self, q, k, v, attn_mask=None):
        seqlen, group = q.shape[1], self.num_heads // self.num_kv_heads
        i = torch.arange(seqlen, device=q.device)[:, None]
        j = torch.arange(seqlen, device=q.device)[None, :]
        left, right = self.window_size
        right = 0 if self.causal else right
        visible = torch.ones(seqlen, seqlen, dtype=torch.bool, device=q.device)
        if left >= 0:
            visible &= j >= i - left
        if right >= 0:
            visible &= j <= i + right
        bias = torch.zeros(visible.shape, dtype=q.dtype, device=q.device).masked_fill(~visible, -math.inf)
        if attn_mask is not None:
            bias = bias + (attn_mask if attn_mask.is_floating_point()
                           else torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device)
                           .masked_fill(~attn_mask, -math.inf))
        qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        kh, vh = kh.repeat_interleave(group, dim=1), vh.repeat_interleave(group, dim=1)
        scores = qh @ kh.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if self.softcap:
            scores = self.softcap * torch.tanh(scores / self.softcap)
        bias = bias.expand(scores.shape)
        empty = (bias == -math.inf).all(-1, keepdim=True)  # a row that sees no key: output 0, as the kernels
        probs = torch.softmax(scores + bias.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
        return (probs @ vh).transpose(1, 2)


def rotary_reference(x, positions, base):
    """Rotary embedding as complex multiplication: (x[d] + i x[d + D/2]) * exp(i * pos * base^(-2d/D))."""
    half = x.shape[-1] // 2
    z = torch.complex(x[..., :half].double(), x[..., half:].double())
    freq = base ** (-2.0 * torch.arange(half, dtype=torch.float64) / x.shape[-1])
    angle = positions.double()[..., None] * freq.to(x.device)  # (S, D/2) or (B, S, D/2)
    z = z * torch.polar(torch.ones_like(angle), angle)[..., None, :]
    return torch.cat([z.real, z.imag], dim=-1).to(x.dtype)


def test_rotary_embedding():
    x = torch.randn(2, 5, 3, 8, dtype=torch.float64)
    for positions in (torch.arange(5), torch.tensor([[3, 4, 5, 6, 7], [0, 0, 1, 2, 3]])):
        torch.testing.assert_close(fnn.rotary_embedding(x, positions, 10000.0), rotary_reference(x, positions, 10000.0))


ATTENTION_CASES = {
    "mha-causal": dict(num_heads=4),
    "gqa-causal-rotary": dict(num_heads=4, num_kv_heads=2, rotary=True),
    "mqa-window": dict(num_heads=4, num_kv_heads=1, window_size=(3, 0)),
    "gqa-bidirectional-window-softcap": dict(num_heads=4, num_kv_heads=2, causal=False, window_size=(2, 1),
                                             softcap=0.5, rotary=True),
    "head_dim-no_bias": dict(num_heads=2, head_dim=24, bias=False),
    "head_dim_v-gqa-rotary": dict(num_heads=4, num_kv_heads=2, head_dim=12, head_dim_v=6, rotary=True),
    "head_dim_v-larger-window": dict(num_heads=2, head_dim=4, head_dim_v=20, window_size=(3, 0)),
}


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("case", list(ATTENTION_CASES))
@pytest.mark.parametrize("mask", [None, "padding", "float"])
def test_attention_module(device, dtype, case, mask):
    kwargs = ATTENTION_CASES[case]
    torch.manual_seed(0)
    ours = fnn.Attention(EMBED, device=device, dtype=dtype, **kwargs)
    ref = TorchCore(EMBED, device=device, dtype=dtype, **kwargs)
    ref.load_state_dict(ours.state_dict())
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(BATCH, SEQ_K, EMBED, generator=gen, dtype=torch.float64).to(device, dtype).requires_grad_()
    attn_mask = None
    if mask == "padding":  # (B, S) True = real token -> (B, 1, 1, S); the first key is real in every row
        attn_mask = (~key_padding(device))[:, None, None, :]
    elif mask == "float":
        attn_mask = torch.randn(BATCH, 1, SEQ_K, SEQ_K, generator=gen, dtype=torch.float64).to(device, dtype)
    positions = torch.arange(SEQ_K, device=device) + 5 if kwargs.get("rotary") else None

    def result(module):
        x.grad = None
        module.zero_grad(set_to_none=True)
        y = module(x, attn_mask=attn_mask, positions=positions)
        y.backward(torch.ones_like(y))
        return y.detach(), None, {"x": x.grad, **{n: p.grad for n, p in module.named_parameters()}}

    assert_same(result(ours), result(ref), dtype)


def test_attention_parameters_and_errors():
    attn = fnn.Attention(EMBED, 4, num_kv_heads=2)
    shapes = {name: tuple(t.shape) for name, t in attn.state_dict().items()}
    assert shapes == {"qkv.weight": ((4 + 2 * 2) * 8, EMBED), "qkv.bias": ((4 + 2 * 2) * 8,),
                      "proj.weight": (EMBED, 4 * 8), "proj.bias": (EMBED,)}
    mla = fnn.Attention(EMBED, 4, num_kv_heads=2, head_dim=12, head_dim_v=6)
    shapes = {name: tuple(t.shape) for name, t in mla.state_dict().items()}
    assert shapes == {"qkv.weight": ((4 + 2) * 12 + 2 * 6, EMBED), "qkv.bias": ((4 + 2) * 12 + 2 * 6,),
                      "proj.weight": (EMBED, 4 * 6), "proj.bias": (EMBED,)}
    with pytest.raises(ValueError, match="head_dim_v must be a positive int"):
        fnn.Attention(EMBED, 4, head_dim_v=0)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        fnn.Attention(EMBED, 4, num_kv_heads=3)
    with pytest.raises(ValueError, match="pass head_dim"):
        fnn.Attention(EMBED, 5)
    with pytest.raises(ValueError, match="even head_dim"):
        fnn.Attention(EMBED, 4, head_dim=7, rotary=True)
    for x in (torch.randn(SEQ_Q, EMBED), torch.randn(BATCH, SEQ_Q, EMBED + 1)):
        with pytest.raises(ValueError, match=rf"x must be a \(batch, seqlen, dim\) tensor with dim = {EMBED}"):
            attn(x)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_rel_bias(causal):
    """Attention(rel_bias_buckets=...) against its own projections around the float64 reference with T5's bias as an
    additive mask: output, and the gradients of x and the table (a zero-initialized float32 parameter)."""
    from test_rel_bias import bias_matrix

    from flashattn_ext.reference import attention_ref

    torch.manual_seed(0)
    attn = fnn.Attention(EMBED, HEADS, num_kv_heads=2, causal=causal, rel_bias_buckets=8, rel_bias_max_distance=12,
                         dtype=torch.float64)
    assert attn.rel_bias.dtype == torch.float32 and not attn.rel_bias.any()
    assert attn.rel_bias_bidirectional == (not causal)
    with torch.no_grad():
        attn.rel_bias.normal_()
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(BATCH, 40, EMBED, generator=gen, dtype=torch.float64, requires_grad=True)
    y = attn(x)
    y.backward(torch.ones_like(y))
    gx, gt = x.grad.clone(), attn.rel_bias.grad.clone()

    xr = x.detach().requires_grad_()
    tr = attn.rel_bias.detach().double().requires_grad_()
    d = attn.head_dim
    q, k, v = (t.unflatten(-1, (-1, d)) for t in attn.qkv(xr).split([HEADS * d, 2 * d, 2 * d], dim=-1))
    out, _ = attention_ref(q, k, v, causal=causal, attn_mask=bias_matrix(tr, 40, 40, 12, not causal).unsqueeze(0))
    ref = attn.proj(out.flatten(-2))
    ref.backward(torch.ones_like(ref))
    assert (y - ref).abs().max() < 1e-10
    assert (gx - xr.grad).abs().max() < 1e-9
    assert (gt.double() - tr.grad).abs().max() < 1e-5 * max(1.0, tr.grad.abs().max().item())
    assert set(attn.state_dict()) == {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias", "rel_bias"}
    with pytest.raises(ValueError, match="rel_bias_buckets must be an int >= 0"):
        fnn.Attention(EMBED, HEADS, rel_bias_buckets=-1)
    with pytest.raises(ValueError, match="rel_bias_max_distance must exceed the exact buckets"):
        fnn.Attention(EMBED, HEADS, rel_bias_buckets=16, rel_bias_max_distance=4, causal=True)
