"""flash_attn_with_kvcache against a float64 reference written here: the cache update (new keys rotated,
then written at cache_seqlens per batch row, through cache_batch_idx or a random page table; rows past the
cache dropped) rebuilt row by row on the host, the rotary embedding as a complex multiplication, and the
attention of each sequence on its gathered keys [cache_leftpad, cache_seqlens + seqlen_new) by
fa_testing.attention64. Dense and paged caches, with and without an append, rotary interleaved and not,
cache_batch_idx, leftpad, GQA, causal / window / softcap / ALiBi / sinks, cache_seqlens as an int and as
a tensor, strided caches, odd head dims; num_splits; no autograd; torch.compile of a decode step; opcheck
of kvcache_fwd; no host synchronization (CUDA); bad inputs (Python and op). CPU float32 / float64 here,
the same tests on CUDA in float16 / bfloat16 / float32 / float64 (marked `cuda`)."""
import dataclasses
import math

import pytest
import torch

import flashattn_ext
from fa_testing import kvcache_fwd_op, opcheck_call, KVCACHE_FWD_ARGS
from fa_testing import DTYPE_NAMES, HAS_CUDA, OUT_TOL, assert_close, assert_lse_close, attention64, no_host_sync

CUDA_MARKS = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]
DEVICE_DTYPES = [("cpu", dt) for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64)] + [
    ("cuda", dt) for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64)]
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=CUDA_MARKS)]
# The appended keys are rotated in float32 (half inputs) or in their dtype and rounded, the reference in
# float64: they may differ by an ulp.
CACHE_TOL = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6, torch.float64: 1e-13}


def device_dtype_params(pairs=DEVICE_DTYPES):
    return [pytest.param(dev, dt, id=f"{dev}-{DTYPE_NAMES[dt]}", marks=CUDA_MARKS if dev == "cuda" else [])
            for dev, dt in pairs]


@dataclasses.dataclass(frozen=True)
class Case:
    """One call. cache: the rows a sequence can reach (dense: seqlen_cache; paged: max_pages * page). page:
    0 for a dense cache, else the page size (a table of distinct random pages, extra_pages unused ones).
    batch_cache > 0: a dense cache of that many batches read through a random cache_batch_idx. new: seqlen_new
    (0: no k, v). seqlens: cache_seqlens as a tuple (tensor), an int, or None. rotary: None, "gptj"
    (interleaved) or "neox", on the first rotary_dim channels. strided: caches made as (batch, nheads_kv,
    rows, headdim) and transposed."""
    b: int = 2
    sq: int = 1
    h: int = 4
    hkv: int = 2
    d: int = 16
    cache: int = 40
    page: int = 0
    extra_pages: int = 3
    batch_cache: int = 0
    new: int = 0
    seqlens: object = (5, 30)
    leftpad: tuple = None
    rotary: str = None
    rotary_dim: int = 16
    causal: bool = False
    window: tuple = (-1, -1)
    softcap: float = 0.0
    alibi: str = None
    sink: bool = False
    strided: bool = False
    label: str = ""

    @property
    def id(self):
        return self.label


CASES = [
    Case(label="decode"),
    Case(new=1, seqlens=(0, 39), causal=True, label="decode-append"),
    Case(sq=3, new=3, seqlens=(4, 20), causal=True, rotary="gptj", label="append-rotary-gptj-causal"),
    Case(sq=2, new=2, seqlens=(9, 1), rotary="neox", rotary_dim=8, label="append-rotary-neox-partial"),
    Case(sq=2, new=2, seqlens=7, rotary="gptj", causal=True, label="seqlens-int"),
    Case(sq=3, seqlens=None, causal=True, label="seqlens-none"),
    Case(b=3, sq=2, new=2, batch_cache=5, seqlens=(3, 0, 30), rotary="neox", causal=True, label="batch-idx"),
    Case(b=3, sq=2, new=1, seqlens=(20, 5, 10), leftpad=(3, 0, 10), causal=True, alibi="bh", label="leftpad"),
    Case(b=3, new=1, page=16, cache=64, seqlens=(0, 17, 63), rotary="gptj", causal=True, label="paged-decode"),
    Case(b=2, sq=4, new=4, h=4, hkv=1, page=32, cache=96, seqlens=(30, 61), leftpad=(5, 40), window=(8, 0),
         rotary="neox", label="paged-leftpad-window"),
    Case(sq=3, new=3, seqlens=(10, 25), window=(6, 2), softcap=2.0, sink=True, rotary="neox",
         label="window-softcap-sink"),
    Case(sq=2, new=2, seqlens=(10, 25), window=(100, -1), rotary="gptj", label="window-wider-than-cache"),
    Case(sq=3, new=4, seqlens=(38, 40), causal=True, label="overflow-dense"),
    Case(new=3, page=16, cache=64, seqlens=(62, 64), rotary="gptj", label="overflow-paged"),
    Case(sq=2, new=2, seqlens=(3, 17), strided=True, rotary="gptj", causal=True, label="strided"),
    Case(sq=2, new=2, d=59, rotary_dim=32, seqlens=(3, 17), rotary="neox", causal=True, alibi="h", label="d59"),
    Case(sq=20, new=20, h=2, hkv=2, cache=64, seqlens=(0, 10), causal=True, alibi="h", label="prefill-mha"),
    Case(sq=5, new=2, seqlens=(6, 12), causal=True, sink=True, label="sq-gt-new"),
    Case(seqlens=(0, 0), sink=True, label="no-keys"),
    Case(b=1, seqlens=0, label="seqlens-int-0"),
]


def rotate64(x, cos, sin, positions, interleaved):
    """Reference rotary embedding in float64: channel pairs (interleaved) or halves as complex numbers times
    exp(i * angle of row positions[b, i])."""
    x = x.to(torch.float64)
    half = cos.shape[1]
    turn = torch.complex(cos.double(), sin.double())[positions][:, :, None, :]  # (b, s, 1, half)
    head, tail = x[..., :2 * half], x[..., 2 * half:]
    if interleaved:
        z = torch.view_as_complex(head.reshape(*head.shape[:-1], half, 2).contiguous()) * turn
        head = torch.view_as_real(z).flatten(-2)
    else:
        z = torch.complex(head[..., :half], head[..., half:]) * turn
        head = torch.cat((z.real, z.imag), dim=-1)
    return torch.cat((head, tail), dim=-1)


def make_inputs(c, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).to(device)

    t = {"q": rnd(c.b, c.sq, c.h, c.d)}
    if c.page:
        max_pages = c.cache // c.page
        n_pages = c.b * max_pages + c.extra_pages
        shape = (n_pages, c.page)
        t["block_table"] = torch.randperm(n_pages, generator=gen)[:c.b * max_pages].view(c.b, max_pages).to(
            torch.int32).to(device)
    else:
        shape = (c.batch_cache or c.b, c.cache)
        if c.batch_cache:
            t["cache_batch_idx"] = torch.randperm(c.batch_cache, generator=gen)[:c.b].to(torch.int32).to(device)
    for name in ("k_cache", "v_cache"):
        if c.strided:
            t[name] = rnd(shape[0], c.hkv, shape[1], c.d).transpose(1, 2)
        else:
            t[name] = rnd(shape[0], shape[1], c.hkv, c.d)
    if c.new:
        t["k"], t["v"] = rnd(c.b, c.new, c.hkv, c.d), rnd(c.b, c.new, c.hkv, c.d)
    if c.rotary:
        angle = torch.rand(c.cache, c.rotary_dim // 2, generator=gen, dtype=torch.float64) * 2 * math.pi
        t["rotary_cos"], t["rotary_sin"] = angle.cos().to(dtype).to(device), angle.sin().to(dtype).to(device)
    if isinstance(c.seqlens, tuple):
        t["cache_seqlens"] = torch.tensor(c.seqlens, dtype=torch.int32, device=device)
    elif c.seqlens is not None:
        t["cache_seqlens"] = c.seqlens
    if c.leftpad is not None:
        t["cache_leftpad"] = torch.tensor(c.leftpad, dtype=torch.int32, device=device)
    if c.alibi:
        shape = (c.h,) if c.alibi == "h" else (c.b, c.h)
        t["alibi_slopes"] = (torch.rand(shape, generator=gen) * 0.5 + 0.1).to(device)
    if c.sink:
        t["sink"] = (torch.randn(c.h, generator=gen) + 1).to(device)
    return t


def call(c, t, **kw):
    return flashattn_ext.flash_attn_with_kvcache(
        t["q"], t["k_cache"], t["v_cache"], t.get("k"), t.get("v"), t.get("rotary_cos"), t.get("rotary_sin"),
        t.get("cache_seqlens"), t.get("cache_batch_idx"), t.get("cache_leftpad"), t.get("block_table"),
        causal=c.causal, window_size=c.window, softcap=c.softcap, rotary_interleaved=c.rotary == "gptj",
        alibi_slopes=t.get("alibi_slopes"), sink=t.get("sink"), **kw)


def reference(c, t, dtype):
    """(k_cache, v_cache) after the append, in dtype on the CPU, and (out, lse) in float64, from the inputs
    t as they were before the call."""
    cpu = {name: x.cpu() if isinstance(x, torch.Tensor) else x for name, x in t.items()}
    k_cache, v_cache = cpu["k_cache"].clone(), cpu["v_cache"].clone()
    seqlens = cpu.get("cache_seqlens")
    if isinstance(seqlens, int):
        seqlens = torch.full((c.b,), seqlens, dtype=torch.int32)
    start = None if seqlens is None else seqlens.long().clamp(0, c.cache)

    def slot(b, r):  # cache index of row r of sequence b
        if c.page:
            return int(cpu["block_table"][b, r // c.page]), r % c.page
        return (int(cpu["cache_batch_idx"][b]) if c.batch_cache else b), r

    q = cpu["q"].to(torch.float64)
    if c.new:
        k_new = cpu["k"].to(torch.float64)
        if c.rotary:
            cos, sin = cpu["rotary_cos"], cpu["rotary_sin"]
            interleaved = c.rotary == "gptj"
            per_row = c.causal or any(0 <= w < c.cache for w in c.window)
            rows = torch.arange(c.sq) if per_row else torch.zeros(c.sq, dtype=torch.long)
            q = rotate64(q, cos, sin, (start[:, None] + rows).clamp(max=c.cache - 1), interleaved)
            q = q.to(dtype).to(torch.float64)
            k_rows = (start[:, None] + torch.arange(c.new)).clamp(max=c.cache - 1)  # rows past it are dropped
            k_new = rotate64(k_new, cos, sin, k_rows, interleaved)
        for b in range(c.b):
            for i in range(c.new):
                r = int(start[b]) + i
                if r < c.cache:
                    k_cache[slot(b, r)] = k_new[b, i].to(dtype)
                    v_cache[slot(b, r)] = cpu["v"][b, i]
    outs, lses = [], []
    for b in range(c.b):
        end = c.cache if start is None else min(int(start[b]) + c.new, c.cache)
        lp = 0 if c.leftpad is None else min(max(c.leftpad[b], 0), end)
        keys = torch.stack([k_cache[slot(b, r)] for r in range(lp, end)]) if end > lp else None
        vals = torch.stack([v_cache[slot(b, r)] for r in range(lp, end)]) if end > lp else None
        sink = cpu.get("sink")
        if keys is None:
            outs.append(torch.zeros(1, c.sq, c.h, c.d, dtype=torch.float64))
            row = sink.double()[None, :, None] if sink is not None else torch.tensor(-math.inf, dtype=torch.float64)
            lses.append(row.expand(1, c.h, c.sq))
            continue
        slopes = cpu.get("alibi_slopes")
        if slopes is not None and slopes.dim() == 2:
            slopes = slopes[b:b + 1]
        o, lse = attention64(q[b:b + 1], keys[None], vals[None], None, c.causal, True, window=c.window,
                             softcap=c.softcap, alibi_slopes=slopes, sink=sink)
        outs.append(o)
        lses.append(lse)
    return k_cache, v_cache, torch.cat(outs), torch.cat(lses)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_kvcache(device, dtype, case):
    t = make_inputs(case, dtype, device)
    k_ref, v_ref, out_ref, lse_ref = reference(case, t, dtype)
    out, lse = call(case, t, return_softmax_lse=True)
    assert out.shape == t["q"].shape and out.dtype == dtype and out.device == t["q"].device
    assert lse.shape == (case.b, case.h, case.sq) and lse.dtype == (torch.float64 if dtype == torch.float64
                                                                      else torch.float32)
    torch.testing.assert_close(t["k_cache"].cpu(), k_ref, rtol=CACHE_TOL[dtype], atol=CACHE_TOL[dtype])
    assert torch.equal(t["v_cache"].cpu(), v_ref), "v_cache after the append"
    assert_close("out", out, out_ref, OUT_TOL[dtype])
    assert_lse_close(lse, lse_ref, OUT_TOL[dtype])


@pytest.mark.parametrize("case", [CASES[2], CASES[9]], ids=lambda c: c.id)
@pytest.mark.parametrize("device", DEVICES)
def test_num_splits_float32(device, case):
    """float32 (CPU and CUDA-core kernels) does not split: every num_splits gives the same bits."""
    results = []
    for num_splits in (0, 1, 4):
        t = make_inputs(case, torch.float32, device)
        results.append((call(case, t, num_splits=num_splits), t["k_cache"], t["v_cache"]))
    for out, kc, vc in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(kc, results[0][1]) and torch.equal(vc, results[0][2])


# Split-KV (the CUDA decode kernel, fwd_decode.cu): caches long enough for many key tiles per split, the rows
# of a KV head packed (GQA / MQA, seqlen_q > 1), every variant the decode kernel serves.
SPLIT_CASES = [
    Case(b=2, h=8, hkv=2, d=128, cache=1500, seqlens=(1500, 777), label="gqa-d128"),
    Case(b=3, h=4, hkv=4, d=64, cache=1024, new=1, seqlens=(0, 600, 1023), causal=True, label="mha-d64-append"),
    Case(b=1, h=32, hkv=1, d=128, sq=2, cache=900, seqlens=(900,), causal=True, label="mqa-64-rows"),
    Case(b=2, h=4, hkv=2, d=256, cache=700, seqlens=(700, 33), softcap=30.0, label="d256-softcap"),
    Case(b=2, h=6, hkv=3, d=59, rotary_dim=32, sq=3, new=3, cache=1200, seqlens=(1000, 50), leftpad=(7, 20),
         causal=True, alibi="bh", rotary="neox", label="d59-leftpad-alibi"),
    Case(b=2, h=4, hkv=2, d=128, sq=4, cache=2048, page=256, seqlens=(2000, 513), window=(300, 0), sink=True,
         label="paged-256-window-sink"),
    Case(b=3, h=8, hkv=4, d=64, cache=960, page=48, seqlens=(959, 17, 500), leftpad=(10, 0, 3), causal=True,
         label="paged-48-leftpad"),
    Case(b=2, h=4, hkv=2, d=96, cache=800, batch_cache=4, sq=2, seqlens=(800, 400), window=(50, 10),
         label="batch-idx-window"),
    Case(b=2, h=2, hkv=2, d=128, cache=1000, seqlens=(0, 0), sink=True, label="no-keys-sink"),
]
SPLIT_DTYPES = [torch.float16, torch.bfloat16]


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("dtype", SPLIT_DTYPES, ids=lambda dt: DTYPE_NAMES[dt])
def test_num_splits(dtype, case):
    """Every split count (1 = none, 0 = the heuristic, up to more splits than key tiles) agrees with the float64
    reference, and with the unsplit result within float rounding."""
    t0 = make_inputs(case, dtype, "cuda")
    _, _, out_ref, lse_ref = reference(case, t0, dtype)
    results = {}
    for num_splits in (1, 0, 2, 3, 7, 16, 128):
        t = make_inputs(case, dtype, "cuda")
        out, lse = call(case, t, num_splits=num_splits, return_softmax_lse=True)
        assert_close(f"out (num_splits={num_splits})", out, out_ref, OUT_TOL[dtype])
        assert_lse_close(lse, lse_ref, OUT_TOL[dtype])
        results[num_splits] = (out.float(), lse)
    out1, lse1 = results[1]
    for n, (out, lse) in results.items():
        torch.testing.assert_close(out, out1, rtol=0, atol=4 * OUT_TOL[dtype], msg=f"num_splits={n} vs 1")
        finite = torch.isfinite(lse1)
        assert torch.equal(finite, torch.isfinite(lse)), f"num_splits={n}: rows without keys differ"
        torch.testing.assert_close(lse[finite], lse1[finite], rtol=0, atol=1e-4, msg=f"lse, num_splits={n}")


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("case", [SPLIT_CASES[0], SPLIT_CASES[4], SPLIT_CASES[5]], ids=lambda c: c.id)
def test_decode_kernel_matches_prefill(case, monkeypatch):
    """The decode kernel and the prefill kernel (FLASHATTN_EXT_DISABLE_DECODE=1, which launch.cu reads per call)
    agree within float rounding on the same call; their lse differ in the last bits somewhere (two kernels, two
    orders of rounding), which shows that the switch took effect."""
    out_dec, lse_dec = call(case, make_inputs(case, torch.bfloat16, "cuda"), return_softmax_lse=True)
    monkeypatch.setenv("FLASHATTN_EXT_DISABLE_DECODE", "1")
    out_pre, lse_pre = call(case, make_inputs(case, torch.bfloat16, "cuda"), return_softmax_lse=True)
    torch.testing.assert_close(out_dec.float(), out_pre.float(), rtol=0, atol=4 * OUT_TOL[torch.bfloat16])
    finite = torch.isfinite(lse_pre)
    assert torch.equal(finite, torch.isfinite(lse_dec)), "rows without keys differ"
    torch.testing.assert_close(lse_dec[finite], lse_pre[finite], rtol=0, atol=1e-4)
    assert not torch.equal(lse_dec, lse_pre), "FLASHATTN_EXT_DISABLE_DECODE changed nothing"


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("sq, h, hkv, d", [(1, 32, 8, 128), (3, 8, 8, 64), (16, 4, 1, 256), (1, 64, 1, 32)])
@pytest.mark.parametrize("causal", [False, True])
def test_decode_shapes_dense(sq, h, hkv, d, causal):
    """flash_attn_func with a few query rows per KV head takes the decode kernel (and its split heuristic);
    forward against the float64 reference, and the backward from its lse."""
    gen = torch.Generator().manual_seed(sq * 1000 + h + d)
    sk = 3000
    q, k, v = (torch.randn(2, s, n, d, generator=gen, dtype=torch.float64) for s, n in ((sq, h), (sk, hkv), (sk, hkv)))
    qc, kc, vc = (x.to(torch.bfloat16).cuda().requires_grad_() for x in (q, k, v))
    out, lse, _ = flashattn_ext.flash_attn_func(qc, kc, vc, causal=causal, return_attn_probs=True)
    ref, ref_lse = attention64(*(x.detach().cpu().double() for x in (qc, kc, vc)), None, causal, True)
    assert_close("out", out, ref, OUT_TOL[torch.bfloat16])
    assert_lse_close(lse, ref_lse, OUT_TOL[torch.bfloat16])
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (qc, kc, vc), dout)
    q64, k64, v64 = (x.detach().cpu().double().requires_grad_() for x in (qc, kc, vc))
    ref64, _ = attention64(q64, k64, v64, None, causal, True)
    rq, rk, rv = torch.autograd.grad(ref64, (q64, k64, v64), dout.cpu().double())
    for name, got, want in (("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)):
        assert_close(name, got, want, 2 * OUT_TOL[torch.bfloat16])


@pytest.mark.parametrize("device", DEVICES)
def test_decode_steps(device):
    """Token-by-token decoding (the cache grows by one row per step) equals one prefill of the same keys."""
    c = Case(b=2, sq=1, new=1, cache=32, seqlens=(0, 3), causal=True, rotary="gptj")
    t = make_inputs(c, torch.float64, device)
    steps, keys, vals = 6, torch.randn(2, 6, 2, 16, dtype=torch.float64), torch.randn(2, 6, 2, 16, dtype=torch.float64)
    queries = torch.randn(2, 6, 4, 16, dtype=torch.float64)
    prefill = dict(t, k_cache=t["k_cache"].clone(), v_cache=t["v_cache"].clone(), q=queries.to(device),
                   k=keys.to(device), v=vals.to(device))
    want = call(dataclasses.replace(c, sq=steps, new=steps), prefill)
    seqlens = t["cache_seqlens"].clone()
    for i in range(steps):
        step = dict(t, q=queries[:, i:i + 1].to(device), k=keys[:, i:i + 1].to(device),
                    v=vals[:, i:i + 1].to(device), cache_seqlens=seqlens)
        got = call(c, step)
        assert_close(f"step {i}", got, want[:, i:i + 1], OUT_TOL[torch.float64])
        seqlens = seqlens + 1
    assert torch.equal(t["k_cache"], prefill["k_cache"]) and torch.equal(t["v_cache"], prefill["v_cache"])


@pytest.mark.parametrize("device", DEVICES)
def test_no_autograd(device):
    """As flash-attn's: the result never requires grad; the op's backward over a KV cache raises a clear error."""
    c = CASES[2]
    t = make_inputs(c, torch.float64, device)
    t["q"].requires_grad_()
    out = call(c, t)
    assert not out.requires_grad
    q = t["q"].detach().requires_grad_()
    full = torch.full((q.shape[0],), t["k_cache"].shape[1], dtype=torch.int32, device=device)
    out, _ = kvcache_fwd_op(q, t["k_cache"], t["v_cache"], full, None, None, None, 0.25, False, -1, -1, 0.0, None,
                            None)
    with pytest.raises(RuntimeError, match="has no backward"):
        out.sum().backward()


@pytest.mark.parametrize("case", [CASES[2], CASES[8]], ids=lambda c: c.id)
@pytest.mark.parametrize("device", DEVICES)
def test_compile_decode_step(device, case):
    """torch.compile(fullgraph=True) traces a decode step (rotary, append in place, attention): the compiled
    step writes the same cache rows and returns the same result as the eager one."""
    def step(q, k_cache, v_cache, k, v, cos, sin, seqlens, block_table):
        return flashattn_ext.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cos, sin, cache_seqlens=seqlens,
                                                     block_table=block_table, causal=True, rotary_interleaved=True)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    eager_t, compiled_t = make_inputs(case, torch.float32, device), make_inputs(case, torch.float32, device)
    outs = []
    for fn, t in ((step, eager_t), (compiled, compiled_t)):
        outs.append(fn(t["q"], t["k_cache"], t["v_cache"], t["k"], t["v"], t.get("rotary_cos"), t.get("rotary_sin"),
                       t["cache_seqlens"], t.get("block_table")))
    assert_close("out (compiled vs eager)", outs[1], outs[0], OUT_TOL[torch.float32])
    assert torch.equal(compiled_t["k_cache"], eager_t["k_cache"]) and torch.equal(compiled_t["v_cache"],
                                                                                  eager_t["v_cache"])


@pytest.mark.parametrize("case", [CASES[7], CASES[9], CASES[6]], ids=lambda c: c.id)
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_kvcache_fwd(device, case):
    t = make_inputs(case, torch.float64, device)
    seqlens = t.get("cache_seqlens")
    args = (t["q"], t["k_cache"], t["v_cache"], seqlens, t.get("cache_batch_idx"), t.get("cache_leftpad"),
            t.get("block_table"), 0.3, case.causal, case.window[0], case.window[1], 1.5, t.get("alibi_slopes"),
            t.get("sink"))
    opcheck_call(KVCACHE_FWD_ARGS, args)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("case", [CASES[8], CASES[13], CASES[4]], ids=lambda c: c.id)
def test_kvcache_no_host_sync(case):
    """The append (rotary, tensor and int cache_seqlens, rows past the cache) and the attention never
    synchronize with the device."""
    t = make_inputs(case, torch.bfloat16, "cuda")
    call(case, t)  # warm-up (lazy initialization may synchronize)
    with no_host_sync():
        call(case, t)


# ----------------------------------------------------------------------------------------------
# Bad inputs
# ----------------------------------------------------------------------------------------------

def bad_call(**changes):
    """flash_attn_with_kvcache on a small valid call (append with rotary) with some arguments replaced."""
    c = Case(sq=2, new=2, seqlens=(3, 9), rotary="gptj")
    t = make_inputs(c, torch.float32, "cpu")
    args = dict(q=t["q"], k_cache=t["k_cache"], v_cache=t["v_cache"], k=t["k"], v=t["v"],
                rotary_cos=t["rotary_cos"], rotary_sin=t["rotary_sin"], cache_seqlens=t["cache_seqlens"])
    args.update(changes)
    return flashattn_ext.flash_attn_with_kvcache(**args)


def paged(n_pages=10, page=16, heads=2):
    return torch.randn(n_pages, page, heads, 16)


TABLE = torch.zeros(2, 2, dtype=torch.int32)
BAD_INPUTS = [
    ("q 3-D", dict(q=torch.randn(2, 4, 16)), ValueError, ["q", "4 dimensions"]),
    ("k_cache dtype", dict(k_cache=torch.randn(2, 40, 2, 16, dtype=torch.float64)), TypeError, ["k_cache", "dtype"]),
    ("v_cache shape", dict(v_cache=torch.randn(2, 41, 2, 16)), ValueError, ["v_cache", "shape"]),
    ("cache batch", dict(k_cache=torch.randn(3, 40, 2, 16), v_cache=torch.randn(3, 40, 2, 16)), ValueError,
     ["k_cache", "batch"]),
    ("k without v", dict(v=None), ValueError, ["k and v"]),
    ("k shape", dict(k=torch.randn(2, 2, 1, 16)), ValueError, ["k", "shape"]),
    ("v dtype", dict(v=torch.randn(2, 2, 2, 16, dtype=torch.float64)), TypeError, ["v", "dtype"]),
    ("append without cache_seqlens", dict(cache_seqlens=None), ValueError, ["cache_seqlens"]),
    ("cache_seqlens int64", dict(cache_seqlens=torch.tensor([3, 9])), TypeError, ["cache_seqlens", "int32"]),
    ("cache_seqlens shape", dict(cache_seqlens=torch.tensor([3], dtype=torch.int32)), ValueError,
     ["cache_seqlens", "shape"]),
    ("cache_seqlens float", dict(cache_seqlens=3.0), TypeError, ["cache_seqlens", "int"]),
    ("cache_seqlens int too large", dict(cache_seqlens=39), ValueError, ["cache_seqlens", "fit"]),
    ("cache_seqlens int negative", dict(cache_seqlens=-1), ValueError, ["cache_seqlens"]),
    ("cache_batch_idx int64", dict(cache_batch_idx=torch.tensor([0, 1])), TypeError, ["cache_batch_idx", "int32"]),
    ("cache_leftpad shape", dict(cache_leftpad=torch.zeros(3, dtype=torch.int32)), ValueError,
     ["cache_leftpad", "shape"]),
    ("block_table int64", dict(block_table=TABLE.long(), k_cache=paged(), v_cache=paged()), TypeError,
     ["block_table", "int32"]),
    ("block_table 1-D", dict(block_table=TABLE[0], k_cache=paged(), v_cache=paged()), ValueError,
     ["block_table", "shape"]),
    ("block_table with cache_batch_idx", dict(block_table=TABLE, k_cache=paged(), v_cache=paged(),
                                              cache_batch_idx=torch.zeros(2, dtype=torch.int32)),
     ValueError, ["cache_batch_idx", "block_table"]),
    ("page size", dict(block_table=TABLE, k_cache=paged(page=24), v_cache=paged(page=24)), ValueError,
     ["page size", "16"]),
    ("cos without sin", dict(rotary_sin=None), ValueError, ["rotary_cos", "rotary_sin"]),
    ("rotary without k", dict(k=None, v=None), ValueError, ["rotary", "k"]),
    ("rotary_dim > headdim", dict(rotary_cos=torch.rand(40, 9), rotary_sin=torch.rand(40, 9)), ValueError,
     ["rotary_dim"]),
    ("rotary too short", dict(rotary_cos=torch.rand(39, 8), rotary_sin=torch.rand(39, 8)), ValueError,
     ["rotary_cos", "rows"]),
    ("rotary shapes differ", dict(rotary_sin=torch.rand(40, 4)), ValueError, ["rotary_cos", "shape"]),
    ("rotary int", dict(rotary_cos=torch.ones(40, 8, dtype=torch.int32)), TypeError, ["rotary_cos"]),
    ("num_splits float", dict(num_splits=1.5), TypeError, ["num_splits"]),
    ("num_splits negative", dict(num_splits=-1), ValueError, ["num_splits", "positive"]),
    ("sink and s_aux", dict(sink=torch.zeros(4), s_aux=torch.zeros(4)), ValueError, ["sink", "s_aux"]),
    ("window", dict(window_size=(-2, 0)), ValueError, ["window_size"]),
    ("softcap", dict(softcap=-1.0), ValueError, ["softcap"]),
    ("alibi shape", dict(alibi_slopes=torch.zeros(3)), ValueError, ["alibi_slopes"]),
]


@pytest.mark.parametrize("name, changes, exc, words", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_inputs(name, changes, exc, words):
    with pytest.raises(exc) as info:
        bad_call(**changes)
    for word in words:
        assert word in str(info.value), f"{name}: {word!r} not in {str(info.value)!r}"


def op_call(**changes):
    """torch.ops.flashattn_ext.kvcache_fwd on a small valid dense call with some arguments replaced."""
    args = dict(q=torch.randn(2, 1, 4, 16), k_cache=torch.randn(2, 40, 2, 16), v_cache=torch.randn(2, 40, 2, 16),
                cache_seqlens=torch.tensor([3, 9], dtype=torch.int32), cache_batch_idx=None, cache_leftpad=None,
                block_table=None, softmax_scale=0.25, causal=True, window_left=-1, window_right=-1, softcap=0.0,
                alibi_slopes=None, sink=None, num_splits=0)
    args.update(changes)
    return kvcache_fwd_op(*args.values())


BAD_OP_INPUTS = [
    ("cache_seqlens int64", dict(cache_seqlens=torch.tensor([3, 9])), ["cache_seqlens", "int32"]),
    ("cache_seqlens shape", dict(cache_seqlens=torch.tensor([3], dtype=torch.int32)), ["cache_seqlens", "shape"]),
    ("cache_leftpad 2-D", dict(cache_leftpad=torch.zeros(2, 1, dtype=torch.int32)), ["cache_leftpad", "dimension"]),
    ("cache_batch_idx float", dict(cache_batch_idx=torch.zeros(2)), ["cache_batch_idx", "int32"]),
    ("k_cache batch", dict(k_cache=torch.randn(3, 40, 2, 16), v_cache=torch.randn(3, 40, 2, 16)),
     ["batch size of k_cache"]),
    ("v_cache heads", dict(v_cache=torch.randn(2, 40, 1, 16)), ["nheads of k_cache", "v_cache"]),
    ("k_cache head dim", dict(k_cache=torch.randn(2, 40, 2, 8)), ["head dim", "q", "k_cache"]),
    ("q dtype", dict(q=torch.randn(2, 1, 4, 16, dtype=torch.float64)), ["q, k_cache and v_cache", "dtype"]),
    ("block_table int64", dict(block_table=TABLE.long(), k_cache=paged(), v_cache=paged()), ["block_table", "int32"]),
    ("block_table batch", dict(block_table=TABLE[:1], k_cache=paged(), v_cache=paged()), ["block_table", "shape"]),
    ("page size", dict(block_table=TABLE, k_cache=paged(page=8), v_cache=paged(page=8)), ["page size", "16"]),
    ("block_table with cache_batch_idx", dict(block_table=TABLE, k_cache=paged(), v_cache=paged(),
                                              cache_batch_idx=torch.zeros(2, dtype=torch.int32)),
     ["cache_batch_idx", "block_table"]),
    ("no pages", dict(block_table=TABLE, k_cache=paged(n_pages=0), v_cache=paged(n_pages=0)), ["page"]),
    ("v_cache pages", dict(block_table=TABLE, k_cache=paged(), v_cache=paged(n_pages=9)), ["pages"]),
    ("sink dtype", dict(sink=torch.zeros(4, dtype=torch.float64)), ["sink"]),
    ("alibi shape", dict(alibi_slopes=torch.zeros(2, 3)), ["alibi_slopes"]),
    ("num_splits negative", dict(num_splits=-2), ["num_splits"]),
]


@pytest.mark.parametrize("name, changes, words", BAD_OP_INPUTS, ids=[b[0] for b in BAD_OP_INPUTS])
def test_bad_op_inputs(name, changes, words):
    with pytest.raises(RuntimeError) as info:
        op_call(**changes)
    for word in words:
        assert word in str(info.value), f"{name}: {word!r} not in {str(info.value)!r}"


# ----------------------------------------------------------------------------------------------
# An append longer than the cache: shapes always, cache_seqlens' contents with check_cache_seqlens=True
# ----------------------------------------------------------------------------------------------

OVERFLOW_CASES = [c for c in CASES if c.id.startswith("overflow")]
FITTING_CASES = [c for c in CASES if not c.id.startswith("overflow")]


def snapshot(t):
    return {name: x.clone() for name, x in t.items() if isinstance(x, torch.Tensor)}


def assert_unchanged(t, before):
    for name, x in before.items():
        assert torch.equal(t[name], x), f"{name} was modified"


@pytest.mark.parametrize("paged_cache", [False, True], ids=["dense", "paged"])
@pytest.mark.parametrize("seqlens", ["tensor", "int"])
@pytest.mark.parametrize("device", DEVICES)
def test_append_longer_than_the_cache(device, seqlens, paged_cache):
    """seqlen_new past the cache's rows (seqlen_cache, or max_pages * page_size) raises from shapes alone,
    naming k_cache, before anything is written; the check reads nothing on the host."""
    c = Case(new=1, seqlens=(0, 0) if seqlens == "tensor" else 0, page=16 if paged_cache else 0, cache=32)
    t = make_inputs(c, torch.float32, device)
    t["k"], t["v"] = (torch.randn(c.b, 33, c.hkv, c.d, device=device) for _ in range(2))
    before = snapshot(t)
    with pytest.raises(ValueError, match="k_cache") as info:
        if device == "cuda" and seqlens == "tensor":
            with no_host_sync():
                call(c, t)
        else:
            call(c, t)
    assert "33" in str(info.value) and "32" in str(info.value)
    assert_unchanged(t, before)


@pytest.mark.parametrize("case", OVERFLOW_CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("device", DEVICES)
def test_check_cache_seqlens_raises_before_writing(device, case):
    """check_cache_seqlens=True: cache_seqlens[b] + seqlen_new past the cache raises (naming cache_seqlens,
    the first row b outside and k_cache) and leaves every tensor as it was."""
    t = make_inputs(case, torch.float32, device)
    before = snapshot(t)
    with pytest.raises(ValueError, match="cache_seqlens\\[0\\].*k_cache"):
        call(case, t, check_cache_seqlens=True)
    assert_unchanged(t, before)


@pytest.mark.parametrize("device", DEVICES)
def test_check_cache_seqlens_negative_and_without_append(device):
    c = Case(seqlens=(5, 30))
    for seqlens in ((-1, 3), (5, 41)):  # no append: cache_seqlens alone must fit the 40 rows
        t = make_inputs(c, torch.float32, device)
        t["cache_seqlens"] = torch.tensor(seqlens, dtype=torch.int32, device=device)
        with pytest.raises(ValueError, match="cache_seqlens\\[[01]\\].*k_cache"):
            call(c, t, check_cache_seqlens=True)


@pytest.mark.parametrize("case", [c for c in FITTING_CASES if isinstance(c.seqlens, tuple)], ids=lambda c: c.id)
def test_check_cache_seqlens_passes_what_fits(case):
    """Contents that fit pass the check and give the unchecked call's results, bit for bit."""
    results = []
    for check in (False, True):
        t = make_inputs(case, torch.float32, "cpu")
        results.append((call(case, t, check_cache_seqlens=check, return_softmax_lse=True), t["k_cache"],
                        t["v_cache"]))
    (out0, lse0), k0, v0 = results[0]
    (out1, lse1), k1, v1 = results[1]
    assert torch.equal(out0, out1) and torch.equal(lse0, lse1) and torch.equal(k0, k1) and torch.equal(v0, v1)


@pytest.mark.parametrize("case", OVERFLOW_CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("device", DEVICES)
def test_unchecked_overflow_stays_inside_the_cache(device, case):
    """Unchecked, rows past the cache are dropped (test_kvcache compares what is written with the reference):
    the memory beside the cache, in the same allocation, is never touched."""
    t = make_inputs(case, torch.float32, device)
    guard = 8  # rows (dense) or pages (paged) of the allocation past the cache
    for name in ("k_cache", "v_cache"):
        x = t[name]
        shape = (x.shape[0] + guard,) + tuple(x.shape[1:]) if case.page else (x.shape[0], x.shape[1] + guard,
                                                                                *x.shape[2:])
        storage = torch.randn(shape, device=device)
        t[name] = storage[:x.shape[0]] if case.page else storage[:, :x.shape[1]]
        t[name].copy_(x)
        t[name + "_outside"] = storage[x.shape[0]:] if case.page else storage[:, x.shape[1]:]
    outside = {name: t[name].clone() for name in ("k_cache_outside", "v_cache_outside")}
    call(case, t)
    assert_unchanged(t, outside)
