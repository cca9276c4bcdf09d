"""flashattn_ext.integrations.transformers on tiny random Hugging Face models built from configs (no
downloads): Llama (GQA), Mistral (sliding window), Gemma-2 (softcap + sliding window) and, where the
installed transformers has it, gpt-oss (sinks + sliding window), each against the same weights under
transformers' "sdpa" ("eager" where sdpa refuses softcap or sinks). Checked: logits and gradients of a
padded batch (left and right padding), 20 greedy generation steps (padded and unpadded prompts, dynamic
and static cache), packed sequences, which of our paths ran with which arguments, dropout, the name.
CPU in float32 (exact agreement within float32 rounding); CUDA in bfloat16 (our error against the
float32 reference at most twice that of the reference run in bfloat16, plus a floor)."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from fa_testing import HAS_CUDA  # noqa: E402
from flashattn_ext.integrations import transformers as hf  # noqa: E402

NAME = hf.register()
VOCAB = 96
SEQ = 12
WINDOW = 4  # below SEQ, so the sliding window hides keys
SOFTCAP = 2.0  # small enough for tanh to bend the scores of these random weights
INIT_STD = 0.2  # wide logits: greedy choices are far from ties
LENGTHS = (SEQ, SEQ - 3, SEQ - 7)  # tokens per row of the padded batch
NEW_TOKENS = 20
PAD_ID = 0
EOS_ID = 2
FP32_TOL = dict(atol=2e-5, rtol=1e-4)
BF16_ERROR_FACTOR = 2.0  # ours (bf16) vs reference (fp32) <= this x reference (bf16) vs reference (fp32) ...
BF16_ERROR_FLOOR = 1e-3  # ... + this x max |reference|
BF16_TOKEN_MARGIN = 0.1  # bf16 greedy token: its reference logit within this of the reference's best


def small(**kwargs):
    """Sizes shared by every tiny model: 2 layers, 4 query heads over 2 key/value heads (GQA), head dim 16."""
    return dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                initializer_range=INIT_STD, pad_token_id=PAD_ID, bos_token_id=1, eos_token_id=EOS_ID, **kwargs)


def llama():
    return transformers.LlamaConfig(**small())


def mistral():
    return transformers.MistralConfig(**small(sliding_window=WINDOW))


def gemma2():
    return transformers.Gemma2Config(**small(sliding_window=WINDOW, attn_logit_softcapping=SOFTCAP,
                                             query_pre_attn_scalar=16,
                                             layer_types=["sliding_attention", "full_attention"]))


def gpt_oss():
    return transformers.GptOssConfig(**small(sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2,
                                             layer_types=["sliding_attention", "full_attention"]))


HAS_GPT_OSS = hasattr(transformers, "GptOssConfig")
# (id, config builder, the reference implementation: sdpa unless it refuses the model's softcap or sinks)
MODELS = [
    pytest.param(llama, "sdpa", id="llama"),
    pytest.param(mistral, "sdpa", id="mistral"),
    pytest.param(gemma2, "eager", id="gemma2"),
    pytest.param(gpt_oss, "eager", id="gpt_oss",
                 marks=pytest.mark.skipif(not HAS_GPT_OSS, reason="transformers without GptOss")),
]
# float32 on the CPU; bfloat16 on CUDA (bfloat16 on the CPU: test_cpu_half.py)
DEVICE_DTYPES = [
    pytest.param("cpu", torch.float32, id="cpu-fp32"),
    pytest.param("cuda", torch.bfloat16, id="cuda-bf16",
                 marks=[pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")]),
]


def build(config_fn, impl, device, dtype, seed=0):
    """A model of config_fn() with attn_implementation=impl; the same weights for the same seed."""
    config = config_fn()
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=impl)
    for name, param in model.named_parameters():
        if name.endswith("sinks"):  # gpt-oss initializes its sinks to zero-mean noise; make them matter
            with torch.no_grad():
                param.normal_(0.0, 1.0)
    assert model.config._attn_implementation == impl
    return model.to(device=device, dtype=dtype).eval()


def pair(config_fn, ref_impl, device, dtype):
    """(ours, reference, reference in float32): three copies of one set of weights."""
    return (build(config_fn, NAME, device, dtype), build(config_fn, ref_impl, device, dtype),
            build(config_fn, ref_impl, device, torch.float32))


def padded_batch(side, device, seed=1):
    """input_ids (len(LENGTHS), SEQ) and attention_mask, each row padded on `side` to SEQ, plus labels
    (-100 at pads) for a loss over the real tokens."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (len(LENGTHS), SEQ), generator=gen)
    mask = torch.zeros(len(LENGTHS), SEQ, dtype=torch.long)
    for row, n in enumerate(LENGTHS):
        if side == "left":
            mask[row, SEQ - n:] = 1
        else:
            mask[row, :n] = 1
    ids = ids.masked_fill(mask == 0, PAD_ID)
    labels = torch.randint(3, VOCAB, ids.shape, generator=gen).masked_fill(mask == 0, -100)
    return ids.to(device), mask.to(device), labels.to(device)


def position_ids_of(mask):
    """Positions counted over the real tokens of each row (as generate computes them)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def loss_and_grads(model, ids, mask, labels):
    """logits (float32) at the real tokens and the parameter gradients of the cross-entropy over them."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_of(mask))
    logits = out.logits.float()
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    loss.backward()
    grads = {name: p.grad.float() for name, p in model.named_parameters() if p.grad is not None}
    return logits[mask.bool()].detach(), grads


def assert_matches(what, got, ref, ref_lowp, ref32):
    """float32: got == ref within FP32_TOL. Lower precision: |got - ref32| <= BF16_ERROR_FACTOR x
    |ref_lowp - ref32| + BF16_ERROR_FLOOR x max|ref32| (max over elements)."""
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    if ref_lowp is None:
        torch.testing.assert_close(got, ref, msg=lambda m: f"{what}: {m}", **FP32_TOL)
        return
    ours = (got - ref32).abs().max().item()
    bound = BF16_ERROR_FACTOR * (ref_lowp - ref32).abs().max().item() + BF16_ERROR_FLOOR * ref32.abs().max().item()
    assert ours <= bound, f"{what}: max error {ours:.3g} against float32 exceeds {bound:.3g}"


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("config_fn,ref_impl", MODELS)
def test_padded_batch_logits_and_grads(config_fn, ref_impl, side, device, dtype):
    ours, ref, ref32 = pair(config_fn, ref_impl, device, dtype)
    batch = padded_batch(side, device)
    logits, grads = loss_and_grads(ours, *batch)
    ref_logits, ref_grads = loss_and_grads(ref, *batch)
    lowp = dtype != torch.float32
    ref32_logits, ref32_grads = loss_and_grads(ref32, *batch) if lowp else (ref_logits, ref_grads)
    assert grads.keys() == ref_grads.keys()
    assert_matches("logits", logits, ref_logits, ref_logits if lowp else None, ref32_logits)
    for name in ref_grads:
        assert_matches(f"grad {name}", grads[name], ref_grads[name], ref_grads[name] if lowp else None,
                       ref32_grads[name])


def greedy(model, ids, mask, **kwargs):
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                          do_sample=False, pad_token_id=PAD_ID, **kwargs)


def token_gap(tokens, ref_model, mask, prompt_len):
    """How far below the best the generated tokens are under ref_model (teacher forcing on `tokens`):
    the largest (best logit - chosen logit) / logit spread over the steps. EOS is out of the running:
    min_new_tokens forbids it."""
    full_mask = torch.cat([mask, torch.ones_like(tokens[:, prompt_len:])], dim=1)
    with torch.no_grad():
        logits = ref_model(input_ids=tokens, attention_mask=full_mask,
                           position_ids=position_ids_of(full_mask)).logits.float()
    step_logits = logits[:, prompt_len - 1:-1]  # (batch, NEW_TOKENS, vocab): predicts tokens[:, prompt_len:]
    spread = step_logits.std(-1)
    step_logits[..., EOS_ID] = -torch.inf
    chosen = step_logits.gather(-1, tokens[:, prompt_len:, None])[..., 0]
    best = step_logits.max(-1).values
    return ((best - chosen) / spread).max().item()


def assert_near_argmax(tokens, ref32, mask, prompt_len, ref_tokens):
    """Our low-precision greedy tokens are as good under the float32 reference as the reference
    implementation's own in the same dtype (ref_tokens): their gap within BF16_ERROR_FACTOR x its gap, or
    BF16_TOKEN_MARGIN logit spreads, whichever is larger (a choice only rounding can flip)."""
    gap = token_gap(tokens, ref32, mask, prompt_len)
    ref_gap = token_gap(ref_tokens, ref32, mask, prompt_len)
    bound = max(BF16_TOKEN_MARGIN, BF16_ERROR_FACTOR * ref_gap)
    assert gap <= bound, (f"a generated token is {gap:.3g} logit spreads below the float32 reference's best "
                          f"(the reference implementation in this dtype: {ref_gap:.3g})")


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("config_fn,ref_impl", MODELS)
def test_greedy_generation(config_fn, ref_impl, padded, device, dtype):
    ours, ref, ref32 = pair(config_fn, ref_impl, device, dtype)
    ids, mask, _ = padded_batch("left", device)
    if not padded:
        mask = torch.ones_like(mask)
    with torch.no_grad():
        tokens = greedy(ours, ids, mask)
        ref_tokens = greedy(ref, ids, mask)
        assert tokens.shape == (ids.shape[0], SEQ + NEW_TOKENS)
        if dtype == torch.float32:
            assert torch.equal(tokens, ref_tokens)
            return
    assert_near_argmax(tokens, ref32, mask, SEQ, ref_tokens)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_static_cache_generation(device, dtype):
    """Prefill of an empty static cache: no mask, more keys (the cache) than queries: the causal diagonal
    must be top-left aligned, as transformers' sdpa path has it."""
    ours, ref, ref32 = pair(llama, "sdpa", device, dtype)
    ids, mask, _ = padded_batch("left", device)
    mask = torch.ones_like(mask)
    with torch.no_grad():
        tokens = greedy(ours, ids, mask, cache_implementation="static")
        ref_tokens = greedy(ref, ids, mask, cache_implementation="static")
        if dtype == torch.float32:
            assert torch.equal(tokens, ref_tokens)
            return
    assert_near_argmax(tokens, ref32, mask, SEQ, ref_tokens)


class Spy:
    """Records the keyword arguments of every flash_attn_func call that the integration makes."""

    def __init__(self, monkeypatch):
        self.calls = []
        real = hf.flash_attn_func

        def spy(q, k, v, **kwargs):
            self.calls.append(dict(kwargs, seqlen_q=q.shape[1], seqlen_k=k.shape[1], nheads_kv=k.shape[2]))
            return real(q, k, v, **kwargs)

        monkeypatch.setattr(hf, "flash_attn_func", spy)


# per model: (sliding window per layer, softcap, has sinks)
EXPECTED_ARGS = {llama: ((None, None), 0.0, False), mistral: ((WINDOW, WINDOW), 0.0, False),
                 gemma2: ((WINDOW, None), SOFTCAP, False), gpt_oss: ((WINDOW, None), 0.0, True)}


@pytest.mark.parametrize("config_fn,ref_impl", MODELS)
def test_paths_and_arguments(config_fn, ref_impl, monkeypatch):
    """Unpadded prefill within the window: the dense path, causal, the layer's window as (w - 1, w - 1),
    GQA without repeated heads; padded: the mask path without a band; softcap and sinks on both."""
    model = build(config_fn, NAME, "cpu", torch.float32)
    windows, softcap, sinks = EXPECTED_ARGS[config_fn]
    spy = Spy(monkeypatch)
    ids, mask, _ = padded_batch("left", "cpu")
    short = ids[:, -(WINDOW - 1):]  # shorter than the window: transformers builds no mask
    with torch.no_grad():
        model(input_ids=short)
        model(input_ids=ids, attention_mask=mask)
    dense, masked = spy.calls[:2], spy.calls[2:]
    assert len(masked) == 2
    for call, window in zip(dense, windows):
        assert "attn_mask" not in call and call["causal"] is True
        assert call["window_size"] == ((window - 1, window - 1) if window else (-1, -1))
        assert call["seqlen_q"] == call["seqlen_k"] == WINDOW - 1 and call["nheads_kv"] == 2
    for call in masked:
        assert call["attn_mask"].dtype == torch.bool and call["attn_mask"].shape[-2:] == (SEQ, SEQ)
        assert "causal" not in call and "window_size" not in call
    for call in spy.calls:
        assert call["softcap"] == softcap and (call["s_aux"] is not None) == sinks and call["dropout_p"] == 0.0


def test_dropout_follows_training_mode(monkeypatch):
    """model.train(): the config's attention_dropout reaches the kernel (and changes the output); eval: 0."""
    def config():
        return transformers.LlamaConfig(**small(attention_dropout=0.5))

    model = build(config, NAME, "cpu", torch.float32)
    spy = Spy(monkeypatch)
    ids, mask, labels = padded_batch("right", "cpu")
    with torch.no_grad():
        eval_logits = model(input_ids=ids, attention_mask=mask).logits
    model.train()
    train_logits, grads = loss_and_grads(model, ids, mask, labels)
    assert [c["dropout_p"] for c in spy.calls] == [0.0, 0.0, 0.5, 0.5]
    assert not torch.allclose(train_logits, eval_logits[mask.bool()])
    assert all(torch.isfinite(g).all() for g in grads.values())


def test_register_name():
    assert NAME == hf.DEFAULT_NAME == "fa_ext" and "flash" not in NAME
    assert hf.register() == NAME  # idempotent
    assert NAME in transformers.AttentionInterface()
    for name in ("flashattn_ext", "my_flash", "sdpa_ours", "paged|fa_ext"):
        with pytest.raises(ValueError, match="choose a name without"):
            hf.register(name)
    assert hf.register("fa_ext_alt") == "fa_ext_alt"


def test_packed_rows_without_mask_raise():
    """cu_seq_lens_q with more sequences than batch rows and no mask (continuous batching): a clear error,
    never a dense causal pass across sequence boundaries."""
    module = torch.nn.Module()
    q = torch.randn(1, 4, 6, 8)
    with pytest.raises(NotImplementedError, match="varlen"):
        hf.attention_forward(module, q, q, q, None, cu_seq_lens_q=torch.tensor([0, 2, 6]))
    out, weights = hf.attention_forward(module, q, q, q, None, cu_seq_lens_q=torch.tensor([0, 6]))
    assert out.shape == (1, 6, 4, 8) and weights is None


@pytest.mark.parametrize("config_fn,ref_impl", MODELS[:2])
def test_packed_sequences(config_fn, ref_impl):
    """Two sequences packed in one row, told apart by position_ids only (a flattening collator's batch):
    transformers builds the block-diagonal mask (training: no cache), and each sequence matches the
    reference and itself alone."""
    ours, ref, _ = pair(config_fn, ref_impl, "cpu", torch.float32)
    ids = padded_batch("right", "cpu")[0][:1]
    position_ids = torch.cat([torch.arange(5), torch.arange(SEQ - 5)])[None]
    with torch.no_grad():
        logits = ours(input_ids=ids, position_ids=position_ids, use_cache=False).logits
        ref_logits = ref(input_ids=ids, position_ids=position_ids, use_cache=False).logits
        torch.testing.assert_close(logits, ref_logits, **FP32_TOL)
        second = ours(input_ids=ids[:, 5:], position_ids=position_ids[:, 5:]).logits
    torch.testing.assert_close(logits[:, 5:], second, **FP32_TOL)
