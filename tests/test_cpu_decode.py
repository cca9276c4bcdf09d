"""The CPU decode path (csrc/cpu/flash_cpu.c decode_fwd: forwards with at most 8 query rows, all query heads of a
kv head per task, the keys cut into splits merged Flash-Decoding style) against the float64 references of
test_kvcache (flash_attn_with_kvcache) and fa_testing.attention64 (flash_attn_func / flash_attn_varlen_func).
FLASHATTN_EXT_CPU_DECODE_SPLITS forces the split count, so that splits cut windows, pages, mask blocks and key
blocks at odd places; seqlen_q 1..4, GQA ratios 1, 2, 4, 8 (tasks of 1 to 24 rows: S by dot products below 8
rows, with the rows in the vector lanes from 8), head dims with a column tail, d_v != d, attn_mask,
varlen with empty sequences, the thread heuristic, and FLASHATTN_EXT_DISABLE_DECODE (the prefill path); in float16
and bfloat16 the path reads the half k / v as they are (no fp32 copy of the cache)."""
import pytest
import torch

import flashattn_ext
from fa_testing import OUT_TOL, assert_close, assert_lse_close, attention64
from test_kvcache import Case, call, make_inputs, reference

SPLITS = (1, 2, 3, 7, 64)
# float16 / bfloat16: the decode path reads the half k / v themselves, widened per key block (flash.h cpu_kv_dtype)
DTYPES = [pytest.param(torch.float32, id="float32"), pytest.param(torch.float64, id="float64"),
          pytest.param(torch.bfloat16, id="bfloat16"), pytest.param(torch.float16, id="float16")]

CASES = [
    Case(b=2, sq=1, h=8, hkv=1, d=32, cache=300, seqlens=(300, 123), causal=True, label="gqa8-sq1"),
    Case(b=2, sq=4, h=8, hkv=2, d=64, cache=160, page=16, seqlens=(150, 37), window=(40, 0), label="gqa4-paged-window"),
    Case(b=3, sq=3, h=3, hkv=3, d=40, cache=200, batch_cache=5, seqlens=(200, 3, 90), leftpad=(0, 1, 30),
         softcap=5.0, alibi="bh", sink=True, causal=True, label="mha-batch-idx-leftpad-softcap-alibi-sink"),
    Case(b=2, sq=2, h=8, hkv=2, d=16, cache=130, new=2, seqlens=(0, 100), causal=True, label="gqa4-append"),
    Case(b=2, sq=4, h=4, hkv=2, d=59, rotary_dim=32, cache=224, page=32, seqlens=(200, 65), leftpad=(7, 64),
         window=(17, 3), rotary="neox", new=4, label="gqa2-d59-paged-leftpad-window"),
    Case(b=1, sq=1, h=2, hkv=2, d=80, cache=150, seqlens=(150,), window=(10, -1), strided=True, label="d80-strided"),
    Case(b=2, sq=2, h=4, hkv=1, d=32, cache=100, seqlens=(0, 0), sink=True, label="no-keys-sink"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", SPLITS)
def test_kvcache_splits(splits, dtype, case, monkeypatch):
    monkeypatch.setenv("FLASHATTN_EXT_CPU_DECODE_SPLITS", str(splits))
    t = make_inputs(case, dtype, "cpu")
    _, _, out_ref, lse_ref = reference(case, t, dtype)
    out, lse = call(case, t, return_softmax_lse=True)
    assert_close("out", out, out_ref, OUT_TOL[dtype])
    assert_lse_close(lse, lse_ref, OUT_TOL[dtype])


def masked_inputs(b, sq, sk, h, hkv, d, d_v, dtype, kind, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, sq, h, d, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(b, sk, hkv, d, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(b, sk, hkv, d_v, generator=gen, dtype=torch.float64).to(dtype)
    keep = torch.rand(b, h, sq, sk, generator=gen) < 0.7
    keep[..., 32:80] = False            # whole mask blocks hidden (no visible entry: skipped)
    keep[0, 1, 0] = False               # a row that sees no key
    if kind == "bool":
        return q, k, v, keep
    add = torch.randn(b, h, sq, sk, generator=gen, dtype=torch.float64).to(dtype)
    return q, k, v, add.masked_fill(~keep, float("-inf"))


@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("sq, h, hkv", [(1, 8, 1), (3, 4, 4), (4, 8, 2), (3, 8, 1)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", (1, 3, 5))
def test_func_mask_dv(splits, dtype, sq, h, hkv, kind, monkeypatch):
    """flash_attn_func with an attn_mask, d_v != d, a window and ALiBi on the decode path."""
    monkeypatch.setenv("FLASHATTN_EXT_CPU_DECODE_SPLITS", str(splits))
    q, k, v, mask = masked_inputs(2, sq, 203, h, hkv, 48, 72, dtype, kind, seed=sq * 10 + h)
    slopes = torch.rand(h) * 0.3
    kw = dict(causal=True, window_size=(150, 0), alibi_slopes=slopes)
    out, lse = flashattn_ext.flash_attn_func(q, k, v, attn_mask=mask, return_lse=True, **kw)
    ref, ref_lse = attention64(q, k, v, None, True, True, window=(150, 0), alibi_slopes=slopes, attn_mask=mask)
    assert_close("out", out, ref, OUT_TOL[dtype])
    assert_lse_close(lse, ref_lse, OUT_TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["float32", "bfloat16",
                                                                                     "float16"])
@pytest.mark.parametrize("splits", (1, 4))
def test_varlen_empty_sequences(splits, dtype, monkeypatch):
    """A varlen batch with max_seqlen_q 3: sequences without queries or without keys, GQA 4, causal (fp16 / bf16:
    k and v read as they are)."""
    monkeypatch.setenv("FLASHATTN_EXT_CPU_DECODE_SPLITS", str(splits))
    lens_q, lens_k = (1, 3, 0, 2), (200, 0, 57, 300)
    h, hkv, d = 8, 2, 32
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(sum(lens_q), h, d, generator=gen).to(dtype)
    k = torch.randn(sum(lens_k), hkv, d, generator=gen).to(dtype)
    v = torch.randn(sum(lens_k), hkv, d, generator=gen).to(dtype)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    out = flashattn_ext.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True)
    for s, (nq, nk) in enumerate(zip(lens_q, lens_k)):
        if nq == 0:
            continue
        rows = slice(int(cu_q[s]), int(cu_q[s + 1]))
        if nk == 0:
            assert torch.equal(out[rows], torch.zeros_like(out[rows])), f"sequence {s} without keys"
            continue
        keys = slice(int(cu_k[s]), int(cu_k[s + 1]))
        ref, _ = attention64(q[None, rows], k[None, keys], v[None, keys], None, True, True)
        assert_close(f"out of sequence {s}", out[None, rows], ref, OUT_TOL[dtype])


def one_and_two_threads():
    """One (batch, kv head) group of 1990 keys called with one thread, then two, each checked against the
    reference: the outputs of the two calls."""
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 4, 64, generator=gen)
    k_cache, v_cache = (torch.randn(1, 2000, 1, 64, generator=gen) for _ in range(2))
    saved = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(flashattn_ext.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=1990, causal=True))
    finally:
        torch.set_num_threads(saved)
    ref, _ = attention64(q, k_cache[:, :1990], v_cache[:, :1990], None, True, True)
    for out in outs:
        assert_close("out", out, ref, OUT_TOL[torch.float32])
    return outs


def test_threads_split():
    """Two threads and one (batch, kv head) group: the heuristic splits the keys (the result's bits differ from
    the one-thread call's), and both agree with the reference."""
    outs = one_and_two_threads()
    assert not torch.equal(outs[0], outs[1]), "two threads did not split the keys"


def test_disable_decode_takes_the_prefill_path(monkeypatch):
    """FLASHATTN_EXT_DISABLE_DECODE=1 (read per call) runs the blocked-Q forward: the same result within
    rounding. Which path ran shows in test_threads_split's shape: the decode path splits the keys of one
    (batch, kv head) group over two threads (other bits than one thread's), the prefill path does not (the same
    bits). Comparing the two paths' bits instead depends on the CPU: on AVX2 they can agree bit for bit."""
    c = CASES[1]
    out_dec = call(c, make_inputs(c, torch.float32, "cpu"))
    monkeypatch.setenv("FLASHATTN_EXT_DISABLE_DECODE", "1")
    out_pre = call(c, make_inputs(c, torch.float32, "cpu"))
    torch.testing.assert_close(out_dec, out_pre, rtol=0, atol=1e-5)
    monkeypatch.setenv("FLASHATTN_EXT_DISABLE_DECODE", "0")
    dec = one_and_two_threads()
    assert not torch.equal(dec[0], dec[1]), "the decode path did not split the keys over two threads"
    monkeypatch.setenv("FLASHATTN_EXT_DISABLE_DECODE", "1")
    pre = one_and_two_threads()
    assert torch.equal(pre[0], pre[1]), "FLASHATTN_EXT_DISABLE_DECODE=1 still split the keys (decode path)"


def test_float16_cache_values_widened_exactly():
    """fp16 k / v widened in the decode path keep every value: subnormals, the largest finite value, signs, inf.
    With q = 0 every key gets the same probability, so out is the mean of v's rows: per column, subnormals whose
    mean is 2^-23, +-65504 beside 2s (mean 1), negatives (-0.375), and an inf (inf)."""
    keys = 96
    cols = ([2.0 ** -24, 3 * 2.0 ** -24], [65504.0, -65504.0, 2.0, 2.0], [-0.5, -0.25], [float("inf"), 1.0, 1.0, 1.0])
    v = torch.stack([torch.tensor(c * (keys // len(c)), dtype=torch.float64) for c in cols], dim=1)
    v = v.to(torch.float16).view(1, keys, 1, 4)
    k = torch.randn(1, keys, 1, 4).to(torch.float16)
    q = torch.zeros(1, 1, 2, 4, dtype=torch.float16)
    out = flashattn_ext.flash_attn_with_kvcache(q, k, v, cache_seqlens=torch.tensor([keys], dtype=torch.int32))
    want = torch.tensor([2.0 ** -23, 1.0, -0.375, float("inf")], dtype=torch.float16).expand(1, 1, 2, 4)
    assert torch.equal(out, want), out
