"""The op flashattn_ext::kv_append (flash_attn_with_kvcache's append of new keys and values, both caches in one
call) against an independent Python loop over the new rows (row i of sequence b to cache row cache_seqlens[b] + i
clamped as documented in csrc/kv_append.h, rows past the cache dropped): dense caches, cache_batch_idx, paged
caches, entries out of range (clamped), a head dim of v's own, strided and padded caches, strided new rows, more
new rows than the cache holds, empty calls; duplicate cache_batch_idx entries (each element one of the values
written); the memory beside the caches never touched; bad inputs (an error naming the argument, nothing
written); opcheck; torch.compile; no host synchronization (CUDA). Exact comparisons: the op copies bytes.
CPU and CUDA (marked `cuda`), float16 / bfloat16 / float32 / float64."""
import dataclasses

import pytest
import torch

import flashattn_ext
from flashattn_ext import _core
from fa_testing import DEVICES, HAS_CUDA, device_dtype_params, no_host_sync


@dataclasses.dataclass(frozen=True)
class Case:
    """One call. rows: the rows of a dense cache, or the pages per sequence of a paged one (page > 0: the page
    size; the table a random permutation of b * rows + 2 pages, `table` overrides entries as (b, slot, value)).
    batch_cache > 0: a dense cache of that many batches addressed through batch_idx. cache_layout: "contiguous",
    "bhsd" (made as (batches, nheads_kv, rows, d) and transposed), or "padded" (the first d channels of a head dim
    of d + 3: strides not multiples of 8). new_layout: "contiguous", "bhsd", or "every-other" (last stride 2)."""
    b: int = 3
    new: int = 1
    hkv: int = 2
    d: int = 16
    d_v: int = 16
    rows: int = 40
    page: int = 0
    batch_cache: int = 0
    batch_idx: tuple = None
    table: tuple = ()
    seqlens: tuple = (0, 17, 39)
    cache_layout: str = "contiguous"
    new_layout: str = "contiguous"
    label: str = ""


CASES = [
    Case(label="dense-decode"),
    Case(new=5, seqlens=(0, 30, 37), label="dense-prefill-drops-past-the-end"),
    Case(new=3, seqlens=(-4, 40, 100), label="dense-seqlens-out-of-range"),
    Case(new=2, batch_cache=5, batch_idx=(4, 0, 2), seqlens=(3, 0, 38), label="batch-idx"),
    Case(new=2, batch_cache=5, batch_idx=(-2, 7, 1), seqlens=(3, 9, 20), label="batch-idx-clamped"),
    Case(new=3, page=16, rows=3, seqlens=(0, 15, 46), label="paged-across-pages-and-past-the-end"),
    Case(new=2, page=16, rows=2, seqlens=(15, 0, 31), table=((0, 0, -1), (2, 1, 99), (1, 0, 8)),
         label="paged-table-clamped"),
    Case(new=2, d=24, d_v=8, seqlens=(5, 39, 12), label="dense-dv-lt-d"),
    Case(new=2, d=16, d_v=40, page=16, rows=2, seqlens=(0, 16, 30), label="paged-dv-gt-d"),
    Case(new=3, seqlens=(1, 20, 38), cache_layout="bhsd", label="strided-caches"),
    Case(new=2, d=20, d_v=12, seqlens=(1, 20, 38), cache_layout="padded", label="padded-caches"),
    Case(new=3, page=16, rows=2, seqlens=(1, 14, 29), cache_layout="bhsd", new_layout="bhsd",
         label="paged-strided-caches-and-rows"),
    Case(new=2, seqlens=(4, 11, 39), new_layout="every-other", label="new-last-stride-2"),
    Case(new=45, seqlens=(0, 3, 40), label="more-rows-than-the-cache"),
    Case(new=2, d=59, d_v=7, hkv=3, seqlens=(2, 38, 0), label="odd-head-dims"),
    Case(new=0, label="no-new-rows"),
    Case(b=0, new=2, seqlens=(), label="empty-batch"),
]


def make(c, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).to(device)

    def tensor(shape, layout, d):
        """(n0, n1, hkv, d) in the given layout."""
        if layout == "bhsd":
            return rnd(shape[0], c.hkv, shape[1], d).transpose(1, 2)
        if layout == "padded":
            return rnd(shape[0], shape[1], c.hkv, d + 3)[..., :d]
        if layout == "every-other":
            return rnd(shape[0], shape[1], c.hkv, 2 * d)[..., ::2]
        return rnd(shape[0], shape[1], c.hkv, d)

    t = {}
    if c.page:
        n_pages = c.b * c.rows + 2
        table = torch.randperm(n_pages, generator=gen)[:c.b * c.rows].view(c.b, c.rows).to(torch.int32)
        for b, slot, value in c.table:
            table[b, slot] = value
        t["block_table"] = table.to(device)
        shape = (n_pages, c.page)
    else:
        shape = (c.batch_cache or c.b, c.rows)
        if c.batch_idx is not None:
            t["cache_batch_idx"] = torch.tensor(c.batch_idx, dtype=torch.int32, device=device)
    t["k_cache"], t["v_cache"] = tensor(shape, c.cache_layout, c.d), tensor(shape, c.cache_layout, c.d_v)
    t["k"], t["v"] = tensor((c.b, c.new), c.new_layout, c.d), tensor((c.b, c.new), c.new_layout, c.d_v)
    t["cache_seqlens"] = torch.tensor(c.seqlens, dtype=torch.int32, device=device)
    return t


def append(t):
    _core.kv_append(k_cache=t["k_cache"], v_cache=t["v_cache"], k=t["k"], v=t["v"], cache_seqlens=t["cache_seqlens"],
                    cache_batch_idx=t.get("cache_batch_idx"), block_table=t.get("block_table"))


def cache_row(t, b, r):
    """(first index, row) of row r of sequence b, or None past the rows it can reach; entries clamped."""
    n0 = t["k_cache"].shape[0]
    table = t.get("block_table")
    if table is not None:
        page = t["k_cache"].shape[1]
        if r >= table.shape[1] * page:
            return None
        return min(max(int(table[b, r // page]), 0), n0 - 1), r % page
    if r >= t["k_cache"].shape[1]:
        return None
    idx = t.get("cache_batch_idx")
    return (b if idx is None else min(max(int(idx[b]), 0), n0 - 1)), r


def reference(t):
    """The caches after the append, by a Python loop on the host (later sequences win where rows coincide)."""
    k_cache, v_cache = t["k_cache"].cpu().clone(), t["v_cache"].cpu().clone()
    k, v = t["k"].cpu(), t["v"].cpu()
    table = t.get("block_table")
    reach = table.shape[1] * k_cache.shape[1] if table is not None else k_cache.shape[1]
    for b in range(k.shape[0]):
        start = min(max(int(t["cache_seqlens"][b]), 0), reach)
        for i in range(k.shape[1]):
            at = cache_row(t, b, start + i)
            if at is not None:
                k_cache[at] = k[b, i]
                v_cache[at] = v[b, i]
    return k_cache, v_cache


def assert_equal(name, got, want):
    got = got.cpu()
    assert got.shape == want.shape
    bad = got != want
    assert not bad.any(), f"{name}: {int(bad.sum())} of {bad.numel()} elements differ, first at {bad.nonzero()[0]}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label)
@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_kv_append(device, dtype, case):
    t = make(case, dtype, device)
    k_want, v_want = reference(t)
    before = {name: x.clone() for name, x in t.items() if name not in ("k_cache", "v_cache")}
    k_cache, v_cache = t["k_cache"], t["v_cache"]
    append(t)
    assert t["k_cache"] is k_cache and t["v_cache"] is v_cache
    assert_equal("k_cache", k_cache, k_want)
    assert_equal("v_cache", v_cache, v_want)
    for name, x in before.items():
        assert torch.equal(t[name], x), f"{name} was modified"


def test_cases_write_and_drop():
    """The cases exercise what they claim: rows written, rows dropped past the end, every layout."""
    written = dropped = 0
    for c in CASES:
        t = make(c, torch.float32, "cpu")
        reach = c.rows * (c.page or 1)
        for b in range(c.b):
            start = min(max(c.seqlens[b], 0), reach)
            written += sum(start + i < reach for i in range(c.new))
            dropped += sum(start + i >= reach for i in range(c.new))
        if c.cache_layout != "contiguous":
            assert not t["k_cache"].is_contiguous() and not t["v_cache"].is_contiguous(), c.label
        if c.new_layout == "every-other":
            assert t["k"].stride(-1) == 2, c.label
    assert written > 50 and dropped > 50


@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_duplicate_cache_batch_idx(device, dtype):
    """Sequences appending to the same cache rows race (documented in csrc/kv_append.h, as in flash-attn): each
    element of such a row holds the value one of them wrote; the other rows are the reference's."""
    c = Case(b=3, new=4, batch_cache=3, batch_idx=(1, 1, 0), seqlens=(10, 12, 5))
    t = make(c, dtype, device)
    k_want, v_want = reference(t)
    append(t)
    for name, new, want in (("k_cache", t["k"].cpu(), k_want), ("v_cache", t["v"].cpu(), v_want)):
        got = t[name].cpu()
        shared = torch.zeros(got.shape[:2], dtype=torch.bool)
        shared[1, 12:14] = True  # rows 12, 13 of cache batch 1: sequence 0's i = 2, 3 and sequence 1's i = 0, 1
        x = got[1, 12:14]
        assert ((x == new[0, 2:4]) | (x == new[1, 0:2])).all(), name
        assert not torch.equal(new[0, 2:4], new[1, 0:2])
        assert_equal(name + " (rows not shared)", got[~shared], want[~shared])


@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[5], CASES[13]], ids=lambda c: c.label)
@pytest.mark.parametrize("device", DEVICES)
def test_memory_beside_the_caches_untouched(device, case):
    """The caches are views into larger storage (more rows per batch, or more pages): rows dropped past the end
    are never written there."""
    t = make(case, torch.float32, device)
    outside = {}
    for name in ("k_cache", "v_cache"):
        x = t[name]
        if case.page:
            storage = torch.randn(x.shape[0] + 2, *x.shape[1:], device=device)
            t[name], rest = storage[:x.shape[0]], storage[x.shape[0]:]
        else:
            storage = torch.randn(x.shape[0], x.shape[1] + 50, *x.shape[2:], device=device)
            t[name], rest = storage[:, :x.shape[1]], storage[:, x.shape[1]:]
        t[name].copy_(x)
        outside[name] = (rest, rest.clone())
    k_want, v_want = reference(t)
    append(t)
    assert_equal("k_cache", t["k_cache"], k_want)
    assert_equal("v_cache", t["v_cache"], v_want)
    for name, (rest, before) in outside.items():
        assert torch.equal(rest, before), f"memory beside {name} was written"


@pytest.mark.parametrize("device", DEVICES)
def test_strided_index_tensors(device):
    """cache_seqlens and cache_batch_idx as strided views (every other element of a longer tensor)."""
    c = Case(new=2, batch_cache=4, batch_idx=(3, 0, 1), seqlens=(5, 38, 0))
    t = make(c, torch.float32, device)
    k_want, v_want = reference(t)
    for name in ("cache_seqlens", "cache_batch_idx"):
        spread = torch.zeros(2 * c.b, dtype=torch.int32, device=device)
        spread[::2] = t[name]
        t[name] = spread[::2]
        assert not t[name].is_contiguous()
    append(t)
    assert_equal("k_cache", t["k_cache"], k_want)
    assert_equal("v_cache", t["v_cache"], v_want)


def valid_args():
    c = Case(new=2, seqlens=(3, 9, 20))
    return make(c, torch.float32, "cpu")


def paged_args():
    return make(Case(new=2, page=16, rows=2, seqlens=(3, 9, 20)), torch.float32, "cpu")


def replaced(base, **changes):
    t = dict(base)
    t.update(changes)
    return t


BAD = [
    ("k_cache last stride", lambda t: replaced(t, k_cache=torch.randn(3, 40, 2, 32)[..., ::2]), ["k_cache", "stride"]),
    ("v_cache rank", lambda t: replaced(t, v_cache=torch.randn(3, 40, 32)), ["v_cache", "dimensions"]),
    ("v_cache rows", lambda t: replaced(t, v_cache=torch.randn(3, 41, 2, 16)), ["v_cache", "shape of k_cache"]),
    ("k head dim", lambda t: replaced(t, k=torch.randn(3, 2, 2, 8)), ["k must have shape", "headdim"]),
    ("k nheads", lambda t: replaced(t, k=torch.randn(3, 2, 1, 16)), ["k must have shape", "nheads_kv"]),
    ("v seqlen", lambda t: replaced(t, v=torch.randn(3, 1, 2, 16)), ["v must have shape"]),
    ("v head dim", lambda t: replaced(t, v=torch.randn(3, 2, 2, 8)), ["v must have shape"]),
    ("k dtype", lambda t: replaced(t, k=t["k"].double()), ["k", "dtype of k_cache"]),
    ("v_cache dtype", lambda t: replaced(t, v_cache=t["v_cache"].double()), ["v_cache", "dtype of k_cache"]),
    ("int cache", lambda t: replaced(t, k_cache=t["k_cache"].int(), v_cache=t["v_cache"].int(), k=t["k"].int(),
                                     v=t["v"].int()), ["k_cache", "float"]),
    ("cache_seqlens int64", lambda t: replaced(t, cache_seqlens=t["cache_seqlens"].long()), ["cache_seqlens", "int32"]),
    ("cache_seqlens shape", lambda t: replaced(t, cache_seqlens=t["cache_seqlens"][:2]), ["cache_seqlens", "shape"]),
    ("cache_batch_idx shape", lambda t: replaced(t, cache_batch_idx=torch.zeros(3, 1, dtype=torch.int32)),
     ["cache_batch_idx", "shape"]),
    ("cache_batch_idx float", lambda t: replaced(t, cache_batch_idx=torch.zeros(3)), ["cache_batch_idx", "int32"]),
    ("cache batch", lambda t: replaced(t, k_cache=torch.randn(4, 40, 2, 16), v_cache=torch.randn(4, 40, 2, 16)),
     ["batch size of k_cache"]),
    ("block_table int64", lambda t: replaced(paged_args(), block_table=paged_args()["block_table"].long()),
     ["block_table", "int32"]),
    ("block_table batch", lambda t: replaced(paged_args(), block_table=paged_args()["block_table"][:2]),
     ["block_table", "shape"]),
    ("page size", lambda t: replaced(t, block_table=torch.zeros(3, 2, dtype=torch.int32)), ["page size", "16"]),
    ("block_table with cache_batch_idx", lambda t: replaced(paged_args(), cache_batch_idx=torch.zeros(
        3, dtype=torch.int32)), ["cache_batch_idx", "block_table"]),
]


@pytest.mark.parametrize("name, change, words", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs(name, change, words):
    t = change(valid_args())
    before = {n: x.clone() for n, x in t.items()}
    with pytest.raises(RuntimeError) as info:
        append(t)
    for word in words:
        assert word in str(info.value), f"{name}: {word!r} not in {str(info.value)!r}"
    for n, x in before.items():
        assert torch.equal(t[n], x), f"{name}: {n} was modified"


@pytest.mark.parametrize("name", ["k_cache", "v_cache", "k", "v", "cache_seqlens", "cache_batch_idx", "block_table"])
def test_meta_beside_cpu_raises(name):
    """A meta tensor beside CPU ones dispatches to the fake kernel, which raises naming the argument (k_cache on
    meta: the others are named, off its device); nothing is written."""
    t = paged_args() if name == "block_table" else valid_args()
    if name == "cache_batch_idx":
        t["cache_batch_idx"] = torch.tensor([2, 0, 1], dtype=torch.int32)
    before = {n: x.clone() for n, x in t.items()}
    t[name] = t[name].to("meta")
    with pytest.raises(RuntimeError, match=r"\b(v_cache|{})\b must be on the device of k_cache \((cpu|meta)\)".format(
            name)):
        append(t)
    for n, x in before.items():
        assert n == name or torch.equal(t[n], x), f"{n} was modified"


def test_all_meta_call():
    """Every tensor on meta: the fake kernel runs (a trace) and checks the shapes."""
    t = {n: x.to("meta") for n, x in valid_args().items()}
    append(t)
    with pytest.raises(RuntimeError, match="v must have"):
        append(replaced(t, v=t["v"][:, :1]))


@pytest.mark.parametrize("case", [CASES[1], CASES[4], CASES[6], CASES[7]], ids=lambda c: c.label)
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device, case):
    t = make(case, torch.float64, device)
    args = (t["k_cache"], t["v_cache"], t["k"], t["v"], t["cache_seqlens"], t.get("cache_batch_idx"),
            t.get("block_table"))
    torch.library.opcheck(torch.ops.flashattn_ext.kv_append.default, args)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("device", DEVICES)
def test_compile(device, backend):
    """torch.compile(fullgraph=True) of a function that appends and then reads the caches: the compiled one writes
    the reference's rows in place (the mutation is declared in the schema) and returns what it read after."""
    def fn(k_cache, v_cache, k, v, seqlens, table):
        _core.kv_append(k_cache=k_cache, v_cache=v_cache, k=k, v=v, cache_seqlens=seqlens, block_table=table)
        return k_cache.sum(dim=(1, 2, 3)) + v_cache.sum(dim=(1, 2, 3))

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    for case in (CASES[5], CASES[6]):
        t = make(case, torch.float64, device)
        k_want, v_want = reference(t)
        sums = compiled(t["k_cache"], t["v_cache"], t["k"], t["v"], t["cache_seqlens"], t["block_table"])
        assert_equal("k_cache", t["k_cache"], k_want)
        assert_equal("v_cache", t["v_cache"], v_want)
        want = k_want.sum(dim=(1, 2, 3)) + v_want.sum(dim=(1, 2, 3))
        assert torch.allclose(sums.cpu(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("case", [CASES[2], CASES[6], CASES[10]], ids=lambda c: c.label)
def test_no_host_sync(case):
    t = make(case, torch.bfloat16, "cuda")
    k_want, v_want = reference(t)
    t_warm = make(case, torch.bfloat16, "cuda")
    append(t_warm)  # warm-up (lazy initialization may synchronize)
    with no_host_sync():
        append(t)
    assert_equal("k_cache", t["k_cache"], k_want)
    assert_equal("v_cache", t["v_cache"], v_want)


@pytest.mark.parametrize("nheads, nheads_kv", [(3, 2), (2, 0)])
def test_kvcache_nheads_checked_before_the_append(nheads, nheads_kv):
    """flash_attn_with_kvcache checks nheads against nheads_kv before kv_append writes (kvcache_fwd, which
    checks it too, runs after the append)."""
    caches = [torch.randn(2, 40, nheads_kv, 16) for _ in range(2)]
    before = [c.clone() for c in caches]
    with pytest.raises(ValueError, match="nheads of q .* nheads_kv of k_cache"):
        flashattn_ext.flash_attn_with_kvcache(torch.randn(2, 1, nheads, 16), *caches, torch.randn(2, 1, nheads_kv, 16),
                                              torch.randn(2, 1, nheads_kv, 16), cache_seqlens=3)
    assert all(torch.equal(c, b) for c, b in zip(caches, before))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["k_cache", "k", "cache_seqlens", "block_table"])
def test_cpu_tensor_beside_cuda_ones_raises(name):
    t = make(Case(new=2, page=16, rows=2, seqlens=(3, 9, 20)), torch.float32, "cuda")
    before = {n: x.cpu() for n, x in t.items()}
    t[name] = t[name].cpu()
    with pytest.raises(RuntimeError, match=r"\b(v_cache|{})\b must be on the device of k_cache".format(name)):
        append(t)
    for n, x in before.items():
        assert torch.equal(t[n].cpu(), x), f"{n} was modified"
