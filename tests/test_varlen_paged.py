"""flash_attn_varlen_func with a block_table (a paged KV cache, forward only) against flashattn_ext.reference's
float64 attention_varlen_ref on the packed keys the pages hold: the keys and values of each sequence are
written into distinct random pages of a cache that also holds unused pages and unused table entries (random
values, never to be read), so the reference never sees the paging. Length mixes with empty and one-token
sequences, seqlen_q != seqlen_k, keys over many pages and within one, page sizes 16 / 48 / 256, GQA, causal /
window / softcap / ALiBi ((nheads,) and (batch, nheads)) / sinks / dropout, seqused_k, rows of q in no
sequence, cu_seqlens_k whose differences alone count, strided caches, an odd head dim; out-of-range contents
clamped (key counts to the table's capacity, entries to the pages); return_attn_probs equal to the packed
call's; the forward-only error; torch.compile (fullgraph, static and dynamic); opcheck; bad inputs (Python
and op). CPU float32 / float64 here, the same tests on CUDA in float16 / bfloat16 / float32 / float64 (marked
`cuda`, skipped without a GPU)."""
import dataclasses
import math

import pytest
import torch

import flashattn_ext
from fa_testing import varlen_fwd_op, opcheck_call, VARLEN_FWD_ARGS
from flashattn_ext.reference import attention_varlen_ref
from fa_testing import (DTYPE_NAMES, HAS_CUDA, OUT_TOL, assert_close, assert_lse_close, expected_lse_dtype,
                        no_host_sync)

CUDA_MARKS = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]
DEVICE_DTYPES = [("cpu", dt) for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64)] + [
    ("cuda", dt) for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64)]
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=CUDA_MARKS)]
DROPOUT_SEED = 1234


def device_dtype_params(pairs=DEVICE_DTYPES):
    return [pytest.param(dev, dt, id=f"{dev}-{DTYPE_NAMES[dt]}", marks=CUDA_MARKS if dev == "cuda" else [])
            for dev, dt in pairs]


@dataclasses.dataclass(frozen=True)
class Case:
    """One paged varlen call. lens[s] = (seqlen_q, seqlen_k) of sequence s; page: the page size; spare: table
    entries per sequence beyond what its longest sequence needs (pointing at pages no key is in); extra_pages:
    pages outside the table; extra_q: rows of q after the last sequence; k_offset: added to cu_seqlens_k (only
    its differences count); used: seqused_k; max_k: max_seqlen_k (None: the longest sequence); strided: the
    cache made as (num_pages, nheads_kv, page_size, headdim) and transposed."""
    lens: tuple
    page: int = 16
    h: int = 4
    hkv: int = 2
    d: int = 16
    spare: int = 1
    extra_pages: int = 3
    extra_q: int = 0
    k_offset: int = 0
    used: tuple = None
    max_k: int = None
    causal: bool = False
    window: tuple = (-1, -1)
    softcap: float = 0.0
    alibi: str = None
    sink: bool = False
    dropout: float = 0.0
    strided: bool = False
    label: str = ""

    @property
    def id(self):
        return self.label

    @property
    def b(self):
        return len(self.lens)

    @property
    def max_q(self):
        return max(sq for sq, _ in self.lens)

    @property
    def max_seqlen_k(self):
        return self.max_k if self.max_k is not None else max(sk for _, sk in self.lens)

    @property
    def max_pages(self):
        return max(-(-sk // self.page) for _, sk in self.lens) + self.spare


CASES = [
    Case(((5, 20), (0, 3), (7, 0), (1, 1), (33, 70), (16, 16)), causal=True, label="mix-causal-p16"),
    Case(((9, 100), (40, 7), (1, 48), (0, 0), (20, 49)), page=48, window=(11, 5), softcap=1.5, alibi="bh",
         sink=True, label="window-softcap-alibi-sink-p48"),
    Case(((3, 300), (64, 64), (1, 257)), page=256, h=6, hkv=2, causal=True, alibi="h", sink=True,
         label="gqa3-alibi-sink-p256"),
    Case(((7, 40), (5, 33), (2, 16), (12, 5)), used=(17, 0, 16, 9), causal=True, label="seqused_k"),
    Case(((8, 30), (17, 60), (1, 1), (4, 0)), page=48, dropout=0.17, window=(9, -1), label="dropout"),
    Case(((130, 70), (3, 129), (1, 17)), h=2, hkv=2, d=59, extra_q=5, k_offset=1000, strided=True, spare=0,
         extra_pages=0, label="many-pages-d59-strided-offset"),
    Case(((6, 0), (3, 0)), sink=True, label="no-keys-sink"),
    Case(((5, 40), (9, 12)), max_k=20, causal=True, label="max_seqlen_k-cut"),
    # a few query rows per KV head over long keys: CUDA fp16/bf16 take the decode kernel with split-KV
    Case(((1, 1500), (2, 700), (0, 30), (4, 2100)), page=256, h=8, hkv=2, d=128, window=(400, 0), sink=True,
         label="decode-long-keys-p256"),
    Case(((3, 900), (1, 1), (2, 1200)), page=48, h=4, hkv=1, d=64, causal=True, softcap=5.0, alibi="bh",
         label="decode-mqa-softcap-alibi-p48"),
]


def cu_seqlens(lengths, device, offset=0):
    out = [offset]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def make_inputs(c, dtype, device, seed=0):
    """q (total_q, h, d), the packed keys / values k, v (total_k, hkv, d) in float64 (what the reference reads,
    rounded to dtype), the paged caches k_cache, v_cache (num_pages, page, hkv, d) in dtype on device holding
    them, block_table, cu_seqlens_q, cu_seqlens_k (the call's, offset by k_offset) and cu_k (the packed one),
    seqused_k, alibi_slopes, sink."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).double()

    total_q = sum(sq for sq, _ in c.lens) + c.extra_q
    total_k = sum(sk for _, sk in c.lens)
    t = {"q": rnd(total_q, c.h, c.d), "k": rnd(total_k, c.hkv, c.d), "v": rnd(total_k, c.hkv, c.d)}
    n_pages = c.b * c.max_pages + c.extra_pages
    table = torch.randperm(n_pages, generator=gen)[:c.b * c.max_pages].view(c.b, c.max_pages)
    caches = []
    for packed in (t["k"], t["v"]):
        cache = rnd(n_pages, c.page, c.hkv, c.d)  # unused rows and pages keep random values
        k0 = 0
        for s, (_, sk) in enumerate(c.lens):
            rows = torch.arange(sk)
            cache[table[s, rows // c.page], rows % c.page] = packed[k0:k0 + sk]
            k0 += sk
        if c.strided:
            cache = cache.transpose(1, 2).contiguous().transpose(1, 2)
        caches.append(cache.to(dtype=dtype, device=device))
    t["k_cache"], t["v_cache"] = caches
    t["block_table"] = table.to(dtype=torch.int32, device=device)
    t["cu_seqlens_q"] = cu_seqlens([sq for sq, _ in c.lens], device)
    t["cu_seqlens_k"] = cu_seqlens([sk for _, sk in c.lens], device, c.k_offset)
    t["cu_k"] = cu_seqlens([sk for _, sk in c.lens], "cpu")
    t["seqused_k"] = None if c.used is None else torch.tensor(c.used, dtype=torch.int32, device=device)
    t["alibi_slopes"] = None
    if c.alibi:
        shape = (c.h,) if c.alibi == "h" else (c.b, c.h)
        t["alibi_slopes"] = (0.05 + 0.5 * torch.rand(shape, generator=gen)).to(device)
    t["sink"] = None
    if c.sink:
        t["sink"] = (-1.0 + 3.0 * torch.rand(c.h, generator=gen, dtype=torch.float64)).to(
            dtype=expected_lse_dtype(dtype), device=device)
    t["device_q"] = t["q"].to(dtype=dtype, device=device)
    return t


def call(c, t, **kw):
    return flashattn_ext.flash_attn_varlen_func(
        t["device_q"], t["k_cache"], t["v_cache"], t["cu_seqlens_q"], t["cu_seqlens_k"], c.max_q, c.max_seqlen_k,
        dropout_p=c.dropout, causal=c.causal, window_size=c.window, softcap=c.softcap,
        alibi_slopes=t["alibi_slopes"], block_table=t["block_table"], seqused_k=t["seqused_k"], sink=t["sink"],
        **kw)


def op_args(c, t, scale=None):
    """Positional arguments of torch.ops.flashattn_ext.varlen_fwd for the call of c."""
    scale = 1.0 / math.sqrt(c.d) if scale is None else scale
    return (t["device_q"], t["k_cache"], t["v_cache"], t["cu_seqlens_q"], t["cu_seqlens_k"], t["seqused_k"], c.max_q,
            c.max_seqlen_k, scale, c.causal, c.window[0], c.window[1], float(c.softcap), t["alibi_slopes"], t["sink"],
            float(c.dropout), False, t["block_table"])


def keep_mask(c, t):
    """The dropout keep mask (b, h, max_q, max_k) of a call made right after torch.manual_seed(DROPOUT_SEED):
    its rng_state replayed through the op, then the dense dropout_mask op (sequence s draws batch index s)."""
    torch.manual_seed(DROPOUT_SEED)
    with torch.no_grad():
        _, _, rng_state, _ = varlen_fwd_op(*op_args(c, t))
    shape_q = t["device_q"].new_empty((c.b, c.max_q, c.h, 1))
    return torch.ops.flashattn_ext.dropout_mask(shape_q, rng_state, c.max_seqlen_k, c.dropout)


def reference(c, t, keep=None):
    """(out, lse) in float64 on the CPU: attention_varlen_ref on the packed keys."""
    sink = None if t["sink"] is None else t["sink"].double().cpu()
    slopes = None if t["alibi_slopes"] is None else t["alibi_slopes"].cpu()
    used = None if t["seqused_k"] is None else t["seqused_k"].cpu()
    return attention_varlen_ref(
        t["q"], t["k"], t["v"], t["cu_seqlens_q"].cpu(), t["cu_k"], c.max_q, c.max_seqlen_k, None, c.causal,
        c.window, c.softcap, slopes, sink, c.dropout, None if keep is None else keep.cpu(), used)


def check(c, t, out, lse, dtype, keep=None):
    out_ref, lse_ref = reference(c, t, keep)
    assert out.shape == t["device_q"].shape and out.dtype == dtype and out.device == t["device_q"].device
    assert lse.shape == (c.h, t["q"].shape[0]) and lse.dtype == expected_lse_dtype(dtype)
    assert_close("out", out, out_ref, OUT_TOL[dtype])
    assert_lse_close(lse, lse_ref, OUT_TOL[dtype])
    if c.extra_q:
        assert (out[-c.extra_q:] == 0).all() and (lse[:, -c.extra_q:] == -math.inf).all(), \
            "rows of q in no sequence: out 0, lse -inf"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_paged_varlen(device, dtype, case):
    t = make_inputs(case, dtype, device)
    keep = keep_mask(case, t) if case.dropout else None
    torch.manual_seed(DROPOUT_SEED)
    out, lse = call(case, t, return_lse=True)
    check(case, t, out, lse, dtype, keep)


@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_paged_equals_packed(device, dtype):
    """The paged call and the packed (total_k, nheads_kv, headdim) call of the same keys agree, dropout
    (same seed) and S_dmask (return_attn_probs) included."""
    c = CASES[4]
    t = make_inputs(c, dtype, device)
    packed = {name: t[name].to(dtype=dtype, device=device) for name in ("k", "v")}
    results = []
    for kv, cu_k, table in ((t, t["cu_seqlens_k"], t["block_table"]),
                            ({"k_cache": packed["k"], "v_cache": packed["v"]}, t["cu_k"].to(device), None)):
        torch.manual_seed(DROPOUT_SEED)
        results.append(flashattn_ext.flash_attn_varlen_func(
            t["device_q"], kv["k_cache"], kv["v_cache"], t["cu_seqlens_q"], cu_k, c.max_q, c.max_seqlen_k,
            dropout_p=c.dropout, causal=c.causal, window_size=c.window, block_table=table, return_attn_probs=True))
    (out, lse, s_dmask), (out_p, lse_p, s_dmask_p) = results
    tol = OUT_TOL[dtype]
    assert_close("out (paged vs packed)", out, out_p, tol)
    assert_lse_close(lse, lse_p, tol)
    assert s_dmask.shape == (c.b, c.h, c.max_q, c.max_seqlen_k)
    assert torch.equal(s_dmask < 0, s_dmask_p < 0), "dropped entries differ"
    assert_close("S_dmask (paged vs packed)", s_dmask, s_dmask_p, tol)


@pytest.mark.parametrize("device, dtype", device_dtype_params([("cpu", torch.float64), ("cuda", torch.float32),
                                                               ("cuda", torch.bfloat16)]))
def test_paged_varlen_clamps(device, dtype):
    """Out-of-range contents never address outside the cache: a key count beyond the table's capacity is cut
    to it, a negative one is 0, table entries below 0 / past the pages read the first / last page."""
    page, hkv, d, h = 16, 2, 16, 4
    gen = torch.Generator().manual_seed(3)
    n_pages = 5
    k_cache = torch.randn(n_pages, page, hkv, d, generator=gen, dtype=torch.float64).to(dtype)
    v_cache = torch.randn(n_pages, page, hkv, d, generator=gen, dtype=torch.float64).to(dtype)
    table = torch.tensor([[3, 9], [-4, 1], [2, 0]], dtype=torch.int32)
    counts = (50, -7, 20)  # capacity 32: cut to 32; -7 -> 0 keys; 20 keys through pages 0 (clamped from -4) and 1
    cu_k = torch.tensor([0, 50, 43, 63], dtype=torch.int32)
    sq = (3, 2, 4)
    cu_q = cu_seqlens(sq, "cpu")
    q = torch.randn(sum(sq), h, d, generator=gen, dtype=torch.float64).to(dtype)
    out, lse = flashattn_ext.flash_attn_varlen_func(
        q.to(device), k_cache.to(device), v_cache.to(device), cu_q.to(device), cu_k.to(device), max(sq), 64,
        causal=True, block_table=table.to(device), return_lse=True)
    keys, vals, lengths = [], [], []
    for s, n in enumerate(counts):
        n = min(max(n, 0), table.shape[1] * page)
        rows = torch.arange(n)
        pages = table[s].long().clamp(0, n_pages - 1)[rows // page]
        keys.append(k_cache[pages, rows % page])
        vals.append(v_cache[pages, rows % page])
        lengths.append(n)
    out_ref, lse_ref = attention_varlen_ref(q.double(), torch.cat(keys).double(), torch.cat(vals).double(), cu_q,
                                            cu_seqlens(lengths, "cpu"), max(sq), 64, causal=True)
    assert_close("out", out, out_ref, OUT_TOL[dtype])
    assert_lse_close(lse, lse_ref, OUT_TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
def test_paged_forward_only(device):
    """As in flash-attn, the forward runs on inputs that require grad (the same result as under no_grad and
    inference_mode) and a backward raises an error naming block_table."""
    c = CASES[0]
    for name in ("device_q", "k_cache", "v_cache"):
        t = make_inputs(c, torch.float64, device)
        t[name].requires_grad_()
        out = call(c, t)
        with torch.no_grad():
            assert_close("out (no_grad)", call(c, t), out.detach(), OUT_TOL[torch.float64])
        with torch.inference_mode():
            assert_close("out (inference_mode)", call(c, t), out.detach(), OUT_TOL[torch.float64])
        with pytest.raises(RuntimeError, match="block_table"):
            out.sum().backward()
    t = make_inputs(CASES[1], torch.float64, device)
    t["sink"].requires_grad_()
    with pytest.raises(RuntimeError, match="block_table"):
        call(CASES[1], t).sum().backward()
    t = make_inputs(c, torch.float64, device)
    t["device_q"].requires_grad_()
    out, _, _, _ = varlen_fwd_op(*op_args(c, t))
    with pytest.raises(RuntimeError, match="block_table"):
        out.sum().backward()


@pytest.mark.parametrize("device, dtype", device_dtype_params([("cpu", torch.float32), ("cuda", torch.bfloat16)]))
def test_paged_compile(device, dtype):
    """torch.compile(fullgraph=True) traces the paged forward; compiled equals eager."""
    c = CASES[1]
    t = make_inputs(c, dtype, device)

    def fn(q, k_cache, v_cache, cu_q, cu_k, table, slopes, sink):
        return flashattn_ext.flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, c.max_q, c.max_seqlen_k,
                                                    window_size=c.window, softcap=c.softcap, alibi_slopes=slopes,
                                                    block_table=table, sink=sink)

    args = (t["device_q"], t["k_cache"], t["v_cache"], t["cu_seqlens_q"], t["cu_seqlens_k"], t["block_table"],
            t["alibi_slopes"], t["sink"])
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    assert_close("out (compiled vs eager)", compiled(*args), fn(*args), OUT_TOL[dtype])


@pytest.mark.parametrize("device, dtype", device_dtype_params([("cpu", torch.float32), ("cuda", torch.bfloat16)]))
def test_paged_compile_dynamic(device, dtype):
    """dynamic=True: the fake kernel's checks hold for symbolic totals, pages and max_seqlen; batches of
    different lengths and caches of different page counts through one compiled function."""
    def fn(q, k_cache, v_cache, cu_q, cu_k, max_q, max_k, table):
        return flashattn_ext.flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, max_q, max_k, causal=True,
                                                    block_table=table)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager", dynamic=True)
    for lens, extra in ((((5, 20), (12, 3), (1, 1)), 3), (((20, 40), (0, 4), (7, 2)), 1),
                        (((3, 33), (9, 9), (2, 0)), 6)):
        c = Case(lens, causal=True, extra_pages=extra)
        t = make_inputs(c, dtype, device)
        out = compiled(t["device_q"], t["k_cache"], t["v_cache"], t["cu_seqlens_q"], t["cu_seqlens_k"], c.max_q,
                       c.max_seqlen_k, t["block_table"])
        out_ref, _ = reference(c, t)
        assert_close("out", out, out_ref, OUT_TOL[dtype])


@pytest.mark.parametrize("case", [CASES[1], CASES[3]], ids=lambda c: c.id)
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_paged_varlen_fwd(device, case):
    t = make_inputs(case, torch.float64, device)
    opcheck_call(VARLEN_FWD_ARGS, op_args(case, t, scale=0.3))


# ----------------------------------------------------------------------------------------------
# Bad inputs
# ----------------------------------------------------------------------------------------------

def mentions(*words):
    return "".join(f"(?=[\\s\\S]*{w})" for w in words)


def paged(n_pages=6, page=16, heads=2, d=8):
    return torch.randn(n_pages, page, heads, d)


TABLE = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)


def bad_call(**changes):
    """A small valid paged flash_attn_varlen_func call with some arguments replaced."""
    args = dict(q=torch.randn(7, 4, 8), k=paged(), v=paged(), cu_seqlens_q=torch.tensor([0, 3, 7], dtype=torch.int32),
                cu_seqlens_k=torch.tensor([0, 20, 29], dtype=torch.int32), max_seqlen_q=4, max_seqlen_k=20,
                block_table=TABLE)
    args.update(changes)
    return flashattn_ext.flash_attn_varlen_func(**args)


BAD_INPUTS = [
    ("block_table int64", dict(block_table=TABLE.long()), TypeError, ["block_table", "int32"]),
    ("block_table float", dict(block_table=TABLE.float()), TypeError, ["block_table", "int32"]),
    ("block_table 1-D", dict(block_table=TABLE[0]), ValueError, ["block_table", "shape"]),
    ("block_table rows", dict(block_table=TABLE[:1]), ValueError, ["block_table", "shape", "batch = 2"]),
    ("block_table no columns", dict(block_table=TABLE[:, :0]), ValueError, ["block_table", "max_pages"]),
    ("block_table not a tensor", dict(block_table=[[0, 1], [2, 3]]), TypeError, ["block_table"]),
    ("page size 24", dict(k=paged(page=24), v=paged(page=24)), ValueError, ["page size", "16"]),
    ("page size 8", dict(k=paged(page=8), v=paged(page=8)), ValueError, ["page size", "16"]),
    ("k packed", dict(k=torch.randn(29, 2, 8)), ValueError, [r"\bk\b", "4 dimensions", "num_pages"]),
    ("v packed", dict(v=torch.randn(29, 2, 8)), ValueError, [r"\bv\b", "4 dimensions", "num_pages"]),
    ("v pages", dict(v=paged(n_pages=5)), ValueError, [r"\bv\b", "pages"]),
]


@pytest.mark.parametrize("changes, exc, words", [pytest.param(c, e, w, id=i) for i, c, e, w in BAD_INPUTS])
def test_paged_bad_inputs(changes, exc, words):
    with pytest.raises(exc, match=mentions(*words)):
        bad_call(**changes)


OP_BAD_INPUTS = [
    ("block_table int64", dict(block_table=TABLE.long()), ["block_table", "int32"]),
    ("block_table rows", dict(block_table=TABLE[:1]), ["block_table", "shape"]),
    ("block_table 3-D", dict(block_table=TABLE[None]), ["block_table", "shape"]),
    ("block_table no columns", dict(block_table=TABLE[:, :0]), ["block_table", "max_pages"]),
    ("page size", dict(k=paged(page=40), v=paged(page=40)), ["page size", "16"]),
    ("no pages", dict(k=paged(n_pages=0), v=paged(n_pages=0)), ["page"]),
    ("k packed", dict(k=torch.randn(29, 2, 8)), [r"\bk\b", "4 dimensions"]),
    ("v pages", dict(v=paged(n_pages=5)), ["pages"]),
    ("v heads", dict(v=paged(heads=1)), ["nheads", r"\bv\b"]),
    ("v page size", dict(v=paged(page=32)), [r"\bv\b", "page size"]),
    ("head dim", dict(k=paged(d=16), v=paged(d=16)), ["head dim"]),
    ("k dtype", dict(k=paged().double()), ["dtype"]),
    ("q heads", dict(q=torch.randn(7, 3, 8)), ["nheads"]),
]


@pytest.mark.parametrize("changes, words", [pytest.param(c, w, id=i) for i, c, w in OP_BAD_INPUTS])
def test_paged_op_bad_inputs(changes, words):
    """The op itself (no Python checks in front) rejects bad paged inputs with a RuntimeError naming them."""
    args = dict(q=torch.randn(7, 4, 8), k=paged(), v=paged(), cu_seqlens_q=torch.tensor([0, 3, 7], dtype=torch.int32),
                cu_seqlens_k=torch.tensor([0, 20, 29], dtype=torch.int32), seqused_k=None, max_seqlen_q=4,
                max_seqlen_k=20, softmax_scale=0.3, causal=False, window_left=-1, window_right=-1, softcap=0.0,
                alibi_slopes=None, sink=None, dropout_p=0.0, deterministic=False, block_table=TABLE)
    args.update(changes)
    with pytest.raises(RuntimeError, match=mentions(*words)):
        varlen_fwd_op(*args.values())


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_paged_bad_devices():
    q = torch.randn(7, 4, 8, device="cuda")
    with pytest.raises(ValueError, match=mentions("block_table", "device")):
        bad_call(q=q, k=paged().cuda(), v=paged().cuda(), cu_seqlens_q=torch.tensor([0, 3, 7], dtype=torch.int32,
                                                                                    device="cuda"),
                 cu_seqlens_k=torch.tensor([0, 20, 29], dtype=torch.int32, device="cuda"))
    with pytest.raises(RuntimeError, match=mentions("block_table", "device")):
        varlen_fwd_op(q, paged().cuda(), paged().cuda(),
                                           torch.tensor([0, 3, 7], dtype=torch.int32, device="cuda"),
                                           torch.tensor([0, 20, 29], dtype=torch.int32, device="cuda"), None, 4, 20,
                                           0.3, False, -1, -1, 0.0, None, None, 0.0, False, TABLE)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_paged_varlen_no_host_sync():
    """The paged forward (sink, ALiBi, seqused_k, window) never synchronizes with the device."""
    c = dataclasses.replace(CASES[3], sink=True, alibi="bh", window=(8, 2))
    t = make_inputs(c, torch.bfloat16, "cuda")
    call(c, t)  # warm-up (lazy initialization may synchronize)
    with no_host_sync():
        call(c, t)
