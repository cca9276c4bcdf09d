"""CUDA-only tests (skipped without a GPU): every output element written (allocator poisoned with
NaN), bitwise-deterministic backward, tensors past 2^31 elements (int64 offsets), peak memory, a
second GPU."""
import ast
import math

import pytest
import torch

import flashattn_ext
from flashattn_ext.integrations import torch_registry
from fa_testing import (
    DTYPE_NAMES,
    HAS_CUDA,
    OUT_TOL,
    SAMPLE_BY_ID,
    Cfg,
    assert_close,
    assert_lse_close,
    attention64,
    grad_tol,
    make_inputs,
    natural_grad_norms,
    reference_with_grads,
    run_python,
)

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]

CUDA_DTYPES = [pytest.param(dt, id=DTYPE_NAMES[dt])
               for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64)]
GiB = 1 << 30


def poison_allocator():
    """Fills the caching allocator's free blocks, small and large pools, with NaN so that an output
    or workspace element a kernel forgets to write (or a workspace it forgets to zero) shows up."""
    small = [torch.full((1 << 17,), math.nan, device="cuda") for _ in range(64)]     # 512 KiB each
    large = [torch.full((1 << 26,), math.nan, device="cuda") for _ in range(4)]      # 256 MiB each
    torch.cuda.synchronize()
    del small, large


POISON_IDS = [
    "b1-q257-k1-h1/1-d8-causal",
    "b1-q31-k7-h2/2-d8-causal",
    "b2-q127-k31-h4/2-d64-causal",
    "b1-q130-k65-h2/1-d128-causal-mixed",
    "b1-q65-k31-h2/2-d256-causal",
    "b2-q31-k127-h8/1-d32-causal",
    "b1-q127-k200-h4/2-d80-causal-scale0.05",
    "b1-q200-k200-h2/2-d256-causal",
]


@pytest.mark.parametrize("dtype", CUDA_DTYPES)
@pytest.mark.parametrize("cfg_id", POISON_IDS)
def test_outputs_written_everywhere(cfg_id, dtype):
    cfg = SAMPLE_BY_ID[cfg_id]
    q, k, v, dout = make_inputs(cfg, dtype, "cuda")
    for deterministic in (False, True):
        poison_allocator()
        out, lse = flashattn_ext.flash_attn_func(q, k, v, causal=cfg.causal, softmax_scale=cfg.scale,
                                                 deterministic=deterministic, return_lse=True)
        poison_allocator()  # between forward and backward: the backward's workspaces
        grads = torch.autograd.grad(out, (q, k, v), dout)
        ref_out, ref_lse, *ref_grads = reference_with_grads(q, k, v, dout, cfg.scale, cfg.causal)
        assert_close("out", out, ref_out, OUT_TOL[dtype])
        assert_lse_close(lse, ref_lse, OUT_TOL[dtype])
        nat = natural_grad_norms(q, k, v, dout, cfg.scale)
        for name, g, r, n in zip(("dq", "dk", "dv"), grads, ref_grads, nat):
            assert_close(name, g, r, grad_tol(dtype), natural=n)


@pytest.mark.parametrize("cfg", [Cfg(2, 1000, 1000, 8, 2, 128), Cfg(1, 777, 2048, 16, 2, 64, causal=True)],
                         ids=lambda c: c.id)
def test_deterministic_backward_bf16(cfg):
    """deterministic=True: dq, dk, dv bitwise identical over 5 runs (GQA: dk/dv sum over heads)."""
    q, k, v, dout = make_inputs(cfg, torch.bfloat16, "cuda")
    first = None
    for _ in range(5):
        out = flashattn_ext.flash_attn_func(q, k, v, causal=cfg.causal, deterministic=True)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        if first is None:
            first = grads
            _, _, *ref_grads = reference_with_grads(q, k, v, dout, cfg.scale, cfg.causal)
            for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
                assert_close(name, g, r, grad_tol(torch.bfloat16))
        else:
            for name, a, b in zip(("dq", "dk", "dv"), first, grads):
                assert torch.equal(a, b), f"{name} not bitwise reproducible with deterministic=True"


# ----------------------------------------------------------------------------------------------
# More than 2^31 elements: int64 offsets
# ----------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_int64_offsets_long_keys(causal):
    """k, v of (1, 2^22 + 7, 8, 64) bf16 (> 2^31 elements, 4 GiB each), 4 queries. Every key but
    the last 64 scores about -128 below them (exp underflows against the last ones), and their values
    are 0: the output is attention over the last 64 keys, which sit past element 2^31, so a 32-bit
    offset shows up; the reference runs on that slice (bottom-right causal is slice-invariant)."""
    sk, h, d, sq, tail = 2 ** 22 + 7, 8, 64, 4, 64
    g = torch.Generator().manual_seed(3)
    u = (torch.randint(0, 2, (h, d), generator=g) * 2 - 1).double()
    q = (4 * u + 0.1 * torch.randn(1, sq, h, d, generator=g, dtype=torch.float64)).to("cuda", torch.bfloat16)
    k = torch.empty(1, sk, h, d, device="cuda", dtype=torch.bfloat16)
    v = torch.zeros(1, sk, h, d, device="cuda", dtype=torch.bfloat16)
    assert k.numel() > 2 ** 31
    k[:, :sk - tail] = (-4 * u).to("cuda", torch.bfloat16)
    k[:, sk - tail:] = torch.randn(1, tail, h, d, generator=g, dtype=torch.float64).to("cuda", torch.bfloat16)
    v[:, sk - tail:] = torch.randn(1, tail, h, d, generator=g, dtype=torch.float64).to("cuda", torch.bfloat16)
    out, lse = flashattn_ext.flash_attn_func(q, k, v, causal=causal, return_lse=True)
    ref_out, ref_lse = attention64(q.cpu(), k[:, sk - tail:].cpu(), v[:, sk - tail:].cpu(), causal=causal)
    assert_close("out", out, ref_out, OUT_TOL[torch.bfloat16])
    assert_lse_close(lse, ref_lse, OUT_TOL[torch.bfloat16])


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_int64_offsets_long_queries(causal):
    """q (and out) of (1, 2^22 + 7, 8, 64) bf16 (> 2^31 elements), 96 keys: the first and last rows
    against the reference on q slices (with causal, the first rows see no key)."""
    sq, sk, h, d, rows = 2 ** 22 + 7, 96, 8, 64, 4
    q = torch.randn(1, sq, h, d, device="cuda", dtype=torch.bfloat16)
    assert q.numel() > 2 ** 31
    k = torch.randn(1, sk, h, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, sk, h, d, device="cuda", dtype=torch.bfloat16)
    out, lse = flashattn_ext.flash_attn_func(q, k, v, causal=causal, return_lse=True)
    ref_out, ref_lse = attention64(q[:, -rows:].cpu(), k.cpu(), v.cpu(), causal=causal)
    assert_close("out (last rows)", out[:, -rows:], ref_out, OUT_TOL[torch.bfloat16])
    assert_lse_close(lse[:, :, -rows:], ref_lse, OUT_TOL[torch.bfloat16])
    if causal:  # row i sees keys j <= i + sk - sq < 0
        assert (out[:, :rows] == 0).all() and (lse[:, :, :rows] == -math.inf).all()
    else:
        ref_out, ref_lse = attention64(q[:, :rows].cpu(), k.cpu(), v.cpu())
        assert_close("out (first rows)", out[:, :rows], ref_out, OUT_TOL[torch.bfloat16])
        assert_lse_close(lse[:, :, :rows], ref_lse, OUT_TOL[torch.bfloat16])


# ----------------------------------------------------------------------------------------------
# Memory
# ----------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_peak_memory_fwd_bwd(causal):
    """B1 H32 S8192 D128 bf16, forward + backward: peak beyond the inputs, out and the three
    gradients stays under 1 GiB (the S x S scores of the 32 heads alone would be 4 GiB in bf16)."""
    b, s, h, d = 1, 8192, 32, 128
    q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = flashattn_ext.flash_attn_func(q, k, v, causal=causal)
    out.backward(dout)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    results = sum(t.numel() * t.element_size() for t in (out, q.grad, k.grad, v.grad))
    extra = peak - base - results
    assert extra < GiB, f"peak {peak / GiB:.2f} GiB, {extra / GiB:.2f} GiB beyond inputs/outputs/grads"
    assert torch.isfinite(out).all() and all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_gpu():
    """Inputs on cuda:1 while cuda:0 is current: the op must launch on the inputs' device."""
    cfg = Cfg(2, 65, 127, 4, 2, 64, causal=True)
    q, k, v, dout = make_inputs(cfg, torch.bfloat16, "cuda:1")
    out, lse = flashattn_ext.flash_attn_func(q, k, v, causal=True, return_lse=True)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert out.device == q.device and all(g.device == q.device for g in grads)
    ref_out, ref_lse, *ref_grads = reference_with_grads(q, k, v, dout, None, True)
    assert_close("out", out, ref_out, OUT_TOL[torch.bfloat16])
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert_close(name, g, r, grad_tol(torch.bfloat16))


@pytest.mark.parametrize("causal", [False, True])
def test_training_shape_bf16(causal):
    """The shape of the benchmark's training step (B8 S2048 H8 D128, bf16), forward and backward,
    against float32 math attention on the same (upcast) inputs on the GPU: long rows, many key and
    query tiles, every CTA of the grid busy."""
    b, s, h, d = 8, 2048, 8, 128
    q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    out = flashattn_ext.flash_attn_func(q, k, v, causal=causal)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    q32, k32, v32 = (t.detach().float().transpose(1, 2).requires_grad_() for t in (q, k, v))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(q32, k32, v32, is_causal=causal)
    ref_grads = torch.autograd.grad(ref, (q32, k32, v32), dout.float().transpose(1, 2))
    assert_close("out", out, ref.transpose(1, 2), OUT_TOL[torch.bfloat16])
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert_close(name, g, r.transpose(1, 2), grad_tol(torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_misaligned_and_odd_stride_inputs(dtype):
    """Contiguous half tensors whose data pointer is not 16-byte aligned (a storage offset of one
    element), and a size-1 batch dimension with an odd stride: the binding must hand the 16-byte
    vector kernels aligned copies (torch's .contiguous() would return them unchanged)."""
    b, s, h, d = 1, 70, 2, 64
    n = b * s * h * d
    flat = torch.randn(3 * n + 3, device="cuda", dtype=dtype)
    q = flat[1:1 + n].view(b, s, h, d)
    k = flat[n + 2:2 * n + 2].view(b, s, h, d)
    v = torch.randn(n, device="cuda", dtype=dtype).as_strided((b, s, h, d), (7, h * d, d, 1))  # batch stride 7
    assert q.data_ptr() % 16 != 0 and k.data_ptr() % 16 != 0 and v.stride(0) % 8 != 0
    dout = torch.randn(b, s, h, d, device="cuda", dtype=dtype)
    for t in (q, k, v):
        t.requires_grad_()
    out = flashattn_ext.flash_attn_func(q, k, v, causal=True)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_out, _, *ref_grads = reference_with_grads(q, k, v, dout, None, True)
    assert_close("out", out, ref_out, OUT_TOL[dtype])
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert_close(name, g, r, grad_tol(dtype))


A100_SMEM = 163 * 1024
SM86_SMEM = 99 * 1024
BACKWARD_PATHS = [
    # On Hopper the backward main kernel is the wgmma one (bwd_sm90.cu) at every head dim, so the sm80
    # kernel that A100s run is reachable only with FLASHATTN_EXT_DISABLE_SM90=1 (read once per process).
    pytest.param({"FLASHATTN_EXT_DISABLE_SM90": "1"}, id="sm80-kernel"),
    # The smaller sm80 tiles chosen on GPUs with less shared memory than Hopper's (A100: 163 KB).
    pytest.param({"FLASHATTN_EXT_DISABLE_SM90": "1", "FLASHATTN_EXT_SMEM_LIMIT": str(A100_SMEM)}, id="a100-tiles"),
]


@pytest.mark.parametrize("env_extra", BACKWARD_PATHS)
def test_other_backward_paths(env_extra):
    """The fp16/bf16 gradient tests over the sample list, in a child process with the path forced."""
    proc = run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "tests/test_attention.py",
                       "-k", "test_flash_attn_func and cuda and (fp16 or bf16)"], env_extra)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout, proc.stdout[-2000:]


SMEM_FALLBACK = (
    "import warnings, torch, flashattn_ext\n"
    "torch.manual_seed(0)\n"
    "q, k, v, g = (torch.randn(2, 90, 2, 256, device='cuda', dtype=torch.bfloat16) for _ in range(4))\n"
    "q, k, v = (t.requires_grad_() for t in (q, k, v))\n"
    "with warnings.catch_warnings(record=True) as caught:\n"
    "    warnings.simplefilter('always')\n"
    "    out = flashattn_ext.flash_attn_func(q, k, v, causal=True, softcap=5.0)\n"
    "    grads = torch.autograd.grad(out, (q, k, v), g)\n"
    "print('KERNELS', flashattn_ext._C.last_cuda_kernels())\n"
    "q64, k64, v64 = (t.detach().double().transpose(1, 2).requires_grad_() for t in (q, k, v))\n"
    "s = 5.0 * torch.tanh(q64 @ k64.transpose(-1, -2) / 16.0 / 5.0)\n"
    "s = s.masked_fill(torch.ones(90, 90, dtype=torch.bool, device='cuda').triu(1), float('-inf'))\n"
    "ref = (s.softmax(-1) @ v64).transpose(1, 2)\n"
    "ref_grads = torch.autograd.grad(ref, (q64, k64, v64), g.double())\n"
    "errs = [(out.double() - ref).abs().max().item()]\n"
    "errs += [(a.double() - b.transpose(1, 2)).abs().max().item() / b.abs().max().item() for a, b in zip(grads, ref_grads)]\n"
    "print('ERRORS', errs)\n"
    "print('WARNINGS', [str(w.message) for w in caught])\n"
)


def test_shared_memory_fallback():
    """Below the shared memory the d256 kernels need (sm86 / sm89: 99 KB; the forward's tiles need 160 KB, the
    backward's 142 KB), the fp16 / bf16 calls run on the fp32 kernels (ops_cuda.cpp half_on_fp32), one warning each
    for the forward and the backward, out and the gradients against float64."""
    proc = run_python(["-c", SMEM_FALLBACK],
                      {"FLASHATTN_EXT_DISABLE_SM90": "1", "FLASHATTN_EXT_SMEM_LIMIT": str(SM86_SMEM)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "KERNELS ('simple.cu', 'simple.cu')" in proc.stdout, proc.stdout
    errs = ast.literal_eval(proc.stdout.split("ERRORS", 1)[1].split("\n", 1)[0].strip())
    assert errs[0] < 2e-2 and max(errs[1:]) < 2e-2, errs
    warned = proc.stdout.split("WARNINGS", 1)[1]
    head = "at head dim 256 has no tensor-core kernel on this GPU (its tiles need"
    assert warned.count("forward " + head) == 1 and warned.count("backward " + head + " 142 KB") == 1, warned


SM86_DECODE = (
    "import sys, torch, flashattn_ext\n"
    "torch.manual_seed(0)\n"
    "d = int(sys.argv[1])\n"
    "q = torch.randn(2, 1, 4, d, device='cuda', dtype=torch.bfloat16)\n"
    "k, v = (torch.randn(2, 3000, 2, d, device='cuda', dtype=torch.bfloat16) for _ in range(2))\n"
    "lens = torch.tensor([3000, 1234], device='cuda', dtype=torch.int32)\n"
    "out = flashattn_ext.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, softcap=20.0)\n"
    "print('KERNEL', flashattn_ext._C.last_cuda_kernels()[0])\n"
    "err = 0.0\n"
    "for b in range(2):\n"
    "    n = int(lens[b])\n"
    "    kk, vv = (t[b, :n].double().repeat_interleave(2, 1).transpose(0, 1) for t in (k, v))\n"
    "    s = 20.0 * torch.tanh(q[b].double().transpose(0, 1) @ kk.transpose(-1, -2) / d ** 0.5 / 20.0)\n"
    "    ref = (s.softmax(-1) @ vv).transpose(0, 1)\n"
    "    err = max(err, (out[b].double() - ref).abs().max().item())\n"
    "print('ERROR', err)\n"
)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_decode_on_sm86_shared_memory(d):
    """With sm86 / sm89's 99 KB of shared memory per block a KV-cache decode runs the split-KV decode kernel with the
    warps whose rings fit (fwd_decode.cu decode_warps: 4 at d64, 3 at d128, 2 at d256), where d128 used to go to
    fwd_sm80 and d256 to raise: out against float64, softcap and GQA on."""
    proc = run_python(["-c", SM86_DECODE, str(d)],
                      {"FLASHATTN_EXT_DISABLE_SM90": "1", "FLASHATTN_EXT_SMEM_LIMIT": str(SM86_SMEM)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "KERNEL fwd_decode.cu" in proc.stdout, proc.stdout
    assert float(proc.stdout.split("ERROR", 1)[1]) < 2e-2, proc.stdout


KERNEL_PROBE = (
    "import torch, flashattn_ext\n"
    "def probe(d, dtype=torch.bfloat16, **kw):\n"
    "    q = torch.randn(1, 256, 2, d, device='cuda', dtype=dtype, requires_grad=True)\n"
    "    flashattn_ext.flash_attn_func(q, q, q, **kw).sum().backward()\n"
    "    return flashattn_ext._C.last_cuda_kernels()\n"
    "print('KERNELS', probe(128, causal=True), probe(256, dropout_p=0.1), probe(64, dtype=torch.float32))\n"
)


@pytest.mark.parametrize("env_extra", [{}] + BACKWARD_PATHS)
def test_last_cuda_kernels(env_extra):
    """_C.last_cuda_kernels (python -m flashattn_ext's kernel report) names the kernels that the dispatch runs: on
    Hopper the wgmma kernels (d256 with dropout: fwd_sm80.cu's forward), with FLASHATTN_EXT_DISABLE_SM90 the sm80
    ones with the tiles the shared memory allows; fp32 the simple kernels."""
    hopper = torch.cuda.get_device_capability() == (9, 0) and "90a" in torch_registry.build_info().CUDA_ARCHS
    proc = run_python(["-c", KERNEL_PROBE], env_extra)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = proc.stdout.split("KERNELS", 1)[1].strip()
    simple = "('simple.cu', 'simple.cu')"
    if hopper and not env_extra:
        want = f"('fwd_sm90.cu', 'bwd_sm90.cu') ('fwd_sm80.cu', 'bwd_sm90.cu') {simple}"
    else:
        smem = int(env_extra.get("FLASHATTN_EXT_SMEM_LIMIT", 0)) or torch_registry.smem_per_block(0)
        tiles = "large" if smem >= 217 * 1024 else "small"  # bwd_sm80.cu's large tiles: up to 217 KB (d256)
        want = f"('fwd_sm80.cu', 'bwd_sm80.cu ({tiles} tiles)') ('fwd_sm80.cu', 'bwd_sm80.cu ({tiles} tiles)') {simple}"
    assert got == want
