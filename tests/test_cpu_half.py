"""float16 / bfloat16 on the CPU (issue 33): the kernels compute in float32 and round the results once, so
out and every gradient must be at least as close to the float64 result as torch's own CPU
scaled_dot_product_attention in the same dtype, on the same rounded inputs. (Every variant and function
also runs in float16 / bfloat16 on the CPU against the float64 reference in test_variants.py,
test_varlen*.py, test_kvcache.py and test_attention.py.)"""
import pytest
import torch
import torch.nn.functional as F

import flashattn_ext
from fa_testing import DTYPE_NAMES, HALF_DTYPES, OUT_TOL, rel_l2, varlen_fwd_op

AMX = flashattn_ext._core.LIMITS["cpu_amx"]  # the packed products' backend: "tiles", "dp" or None
# (FLASHATTN_EXT_CPU_AMX value, backend) of each backend this CPU has: the default, and the dot products where
# they are not it (csrc/cpu/amx.c)
AMX_MODES = ([("1", AMX)] if AMX else []) + ([("dp", "dp")] if AMX == "tiles" and
                                            flashattn_ext._core.LIMITS["cpu_amx_dp"] else [])


def packed(dtype, backend):
    """Whether backend runs the products of dtype's calls: AMX tiles fp16 and bf16 in every pass, the dot products the
    bf16 forward (csrc/cpu/flash_cpu.c amx_on)."""
    return backend == "tiles" or dtype == torch.bfloat16

# (batch, nheads, nheads_kv, seqlen_q, seqlen_k, headdim), SDPA's arguments
CASES = {
    "dense": ((2, 4, 4, 150, 170, 64), {}),
    "causal": ((1, 4, 4, 200, 200, 32), dict(is_causal=True)),
    "gqa": ((2, 6, 2, 90, 130, 64), dict(enable_gqa=True)),
    "mask_add": ((2, 4, 4, 120, 140, 64), dict(attn_mask="add")),
    "mask_bool": ((1, 3, 3, 100, 160, 16), dict(attn_mask="bool")),
}


def run(fn, q, k, v, dout, kwargs):
    """out and the gradients of q, k, v (and of a float mask) of fn on leaf copies of the inputs."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    mask = kwargs.get("attn_mask")
    if mask is not None and mask.is_floating_point():
        mask = mask.detach().clone().requires_grad_()
        leaves.append(mask)
    out = fn(*leaves[:3], **{**kwargs, "attn_mask": mask} if mask is not None else kwargs)
    grads = torch.autograd.grad(out, leaves, dout)
    return [out.detach()] + list(grads)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda dt: DTYPE_NAMES[dt])
def test_error_no_worse_than_torch(dtype, case):
    (b, h, hkv, sq, sk, d), kwargs = CASES[case]
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, sq, d, generator=gen).to(dtype)
    k, v = (torch.randn(b, hkv, sk, d, generator=gen).to(dtype) for _ in range(2))
    dout = torch.randn(b, h, sq, d, generator=gen).to(dtype)
    if kwargs.get("attn_mask") == "add":
        kwargs = {**kwargs, "attn_mask": torch.randn(b, 1, sq, sk, generator=gen).to(dtype).expand(b, h, sq, sk)}
    elif kwargs.get("attn_mask") == "bool":
        kwargs = {**kwargs, "attn_mask": torch.rand(b, h, sq, sk, generator=gen) > 0.3}
    kwargs64 = {name: (x.double() if torch.is_tensor(x) and x.is_floating_point() else x) for name, x in kwargs.items()}
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        ref = run(F.scaled_dot_product_attention, q.double(), k.double(), v.double(), dout.double(), kwargs64)
    ours = run(flashattn_ext.scaled_dot_product_attention, q, k, v, dout, kwargs)
    theirs = run(F.scaled_dot_product_attention, q, k, v, dout, kwargs)
    names = ["out", "dq", "dk", "dv", "dmask"]
    for name, got, other, want in zip(names, ours, theirs, ref):
        assert got.dtype == dtype, name
        ours_err, torch_err = rel_l2(got, want), rel_l2(other, want)
        # Where torch reaches the floor (the float64 result rounded to dtype), ours may pass it by as much
        # as float32 arithmetic moves a value across a rounding boundary.
        floor = rel_l2(want.to(dtype), want)
        bound = max(torch_err, floor * (1 + OUT_TOL[torch.float32]))
        assert ours_err <= bound, f"{name}: ours {ours_err:.3g}, torch's {torch_err:.3g}, floor {floor:.3g}"


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda dt: DTYPE_NAMES[dt])
def test_results_in_the_input_dtype(dtype):
    """out and the gradients in the input dtype, lse and a float mask's gradient in float32, as on CUDA."""
    q, k, v = (torch.randn(1, 40, 2, 16, dtype=dtype, requires_grad=True) for _ in range(3))
    mask = torch.randn(1, 2, 40, 40, dtype=dtype, requires_grad=True)
    out, lse = flashattn_ext.flash_attn_func(q, k, v, attn_mask=mask, return_lse=True)
    out.sum().backward()
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert q.grad.dtype == k.grad.dtype == v.grad.dtype == mask.grad.dtype == dtype
    dq, dk, dv, dmask, _ = torch.ops.flashattn_ext.bwd(
        torch.ones_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse,
        torch.zeros(2, dtype=torch.int64), 0.25, False, True, -1, -1, 0.0, None, None, mask.detach(), 0.0, False, True)
    assert dq.dtype == dk.dtype == dv.dtype == dtype and dmask.dtype == torch.float32


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda dt: DTYPE_NAMES[dt])
def test_forward_returns_its_float32_out_for_the_backward(dtype):
    """fwd and varlen_fwd return out rounded to dtype and, as out32, the float32 out it was rounded from, which
    their autograd saves: the backward's delta without out's rounding error. The backward takes either out: the
    rounded one (as torch and flash-attn) moves dq further from the float64 result than out32 does."""
    gen = torch.Generator().manual_seed(1)
    q, k, v, dout = (torch.randn(1, 96, 2, 32, generator=gen).to(dtype) for _ in range(4))
    mask = torch.randn(1, 2, 96, 96, generator=gen).to(dtype)
    out, lse, rng, out32 = torch.ops.flashattn_ext.fwd(q, k, v, 0.3, False, True, -1, -1, 0.0, None, None, mask,
                                                       0.0, False)
    assert out32.dtype == torch.float32 and out32.shape == out.shape
    assert torch.equal(out32.to(dtype), out)
    bhsd = [t.double().transpose(1, 2).requires_grad_() for t in (q, k, v)]
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        want = F.scaled_dot_product_attention(*bhsd, attn_mask=mask.double(), scale=0.3)
    want_dq, = torch.autograd.grad(want, bhsd[0], dout.double().transpose(1, 2))
    want, want_dq = want.transpose(1, 2), want_dq.transpose(1, 2)
    # bf16 on AMX: the forward's P V product takes P to 16 significant bits (csrc/cpu/amx.h), 2^-17 relative
    # against the 2^-9 of out's rounding to bf16; fp16 and the fp32 kernels keep P exact
    assert rel_l2(out32, want) < (1e-5 if dtype == torch.bfloat16 and AMX else 1e-6)
    cu = torch.tensor([0, 96], dtype=torch.int32)
    vout, _, _, vout32 = varlen_fwd_op(q[0], k[0], v[0], cu, cu, None, 96, 96, 0.3, False, -1,
                                                            -1, 0.0, None, None, 0.0, False)
    assert vout32.dtype == torch.float32 and torch.equal(vout32.to(dtype), vout)
    err = {}
    for name, o in (("out32", out32), ("rounded", out)):
        dq = torch.ops.flashattn_ext.bwd(dout, q, k, v, o, lse, rng, 0.3, False, True, -1, -1, 0.0, None, None, mask,
                                         0.0, False, False)[0]
        err[name] = rel_l2(dq, want_dq)
    assert err["out32"] <= rel_l2(want_dq.to(dtype), want_dq) * (1 + OUT_TOL[torch.float32]) < err["rounded"], err
    x = q.float()  # out32 only beside fp16 / bf16 q
    with pytest.raises(RuntimeError, match="out must have the dtype of q"):
        torch.ops.flashattn_ext.bwd(dout.float(), x, x, x, out32.double(), lse, rng, 0.3, False, True, -1, -1, 0.0,
                                    None, None, None, 0.0, False, False)


AMX_VARIANTS = {  # flash_attn_func arguments; every product of the fwd, dK/dV and dQ passes runs on the tiles
    "dense": {},
    "causal_gqa": dict(causal=True),
    "softcap_window": dict(softcap=20.0, window_size=(40, 7)),
    "mask_dropout": dict(attn_mask="add", dropout_p=0.2),
    "headdims_160_72": dict(d=160, d_v=72),
}


@pytest.mark.skipif(not AMX, reason="no AMX-BF16 or AVX512-BF16 on this CPU (or FLASHATTN_EXT_CPU_AMX=0)")
@pytest.mark.parametrize("mode", AMX_MODES, ids=lambda m: m[1])
@pytest.mark.parametrize("variant", list(AMX_VARIANTS))
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda dt: DTYPE_NAMES[dt])
def test_amx_products_as_exact_as_the_fp32_kernels(dtype, variant, mode, monkeypatch):
    """fp16 / bf16 on a CPU with AMX (or AVX512-BF16: the bf16 forward): the products run on bf16 tiles (dot
    products) with each fp32 operand split exactly into bf16 terms (csrc/cpu/amx.c), so out and the gradients are
    as close to the float64 result as with the fp32 kernels (FLASHATTN_EXT_CPU_AMX=0), element by element within a
    rounding step of the dtype."""
    env, backend = mode
    if not packed(dtype, backend):
        pytest.skip("the dot products take the bf16 forward only")
    kw = dict(AMX_VARIANTS[variant])
    d, d_v = kw.pop("d", 64), kw.pop("d_v", 64)
    b, sq, sk, h, hkv = 2, 150, 190, 4, (2 if variant == "causal_gqa" else 4)
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(b, sq, h, d, generator=gen).to(dtype)
    k = torch.randn(b, sk, hkv, d, generator=gen).to(dtype)
    v = torch.randn(b, sk, hkv, d_v, generator=gen).to(dtype)
    dout = torch.randn(b, sq, h, d_v, generator=gen).to(dtype)
    if kw.get("attn_mask") == "add":
        kw["attn_mask"] = torch.randn(b, h, sq, sk, generator=gen).to(dtype)

    def run(x_dtype, amx):
        monkeypatch.setenv("FLASHATTN_EXT_CPU_AMX", amx)
        leaves = [t.to(x_dtype).requires_grad_() for t in (q, k, v)]
        args = {n: (t.to(x_dtype) if torch.is_tensor(t) else t) for n, t in kw.items()}
        torch.manual_seed(11)  # the same dropout mask in every run
        out = flashattn_ext.flash_attn_func(*leaves, **args)
        return [out.detach()] + list(torch.autograd.grad(out, leaves, dout.to(x_dtype)))

    ref = run(torch.float64, "0")
    fp32_kernels = run(dtype, "0")
    # operands packed once per call; per task step (above FLASH_CPU_PACK_MAX_BYTES; the default backend's)
    for mode in ((env, "step") if backend == AMX else (env,)):
        amx = run(dtype, mode)
        for name, a, f, want in zip(("out", "dq", "dk", "dv"), amx, fp32_kernels, ref):
            assert a.dtype == dtype, name
            err_amx, err_f32 = rel_l2(a, want), rel_l2(f, want)
            assert err_amx <= err_f32 * 1.02 + 1e-6, f"{mode} {name}: AMX {err_amx:.3g}, fp32 kernels {err_f32:.3g}"
            step = torch.finfo(dtype).eps * want.abs().clamp_min(want.abs().max() * 1e-2)
            assert ((a.double() - f.double()).abs() <= 2 * step + 1e-6).all(), f"{mode} {name}"


@pytest.mark.skipif(not AMX, reason="no AMX-BF16 or AVX512-BF16 on this CPU (or FLASHATTN_EXT_CPU_AMX=0)")
@pytest.mark.parametrize("call", ["dense", "dense_dropout", "varlen", "kvcache", "kvcache_paged"])
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda dt: DTYPE_NAMES[dt])
def test_amx_forward_reads_half_inputs_as_the_fp32_copies(dtype, call, monkeypatch):
    """With AMX the dense, varlen and KV-cache prefill forwards read fp16 / bf16 q, k and v as they are
    (flash_cpu_fwd_reads_half: the rows widened as they are packed, every key tile once per call); with
    FLASHATTN_EXT_CPU_AMX=step (operands packed per step) they run on fp32 copies of q, k and v as before. The same
    values meet the same tile products, so out and lse must be equal bit for bit (a perturbed widening of k / v
    fails all ten cases, of bf16 q the five bf16 ones)."""
    if not packed(dtype, AMX):
        pytest.skip("the dot products take the bf16 forward only")
    gen = torch.Generator().manual_seed(5)
    b, sq, hq, hk, d = 2, 40, 4, 2, 72

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    q = rand(b, sq, hq, d)
    if call.startswith("dense"):
        k, v = rand(b, 300, hk, d), rand(b, 300, hk, 40)
        p = 0.3 if call == "dense_dropout" else 0.0

        def run():
            torch.manual_seed(2)
            return flashattn_ext.flash_attn_func(q, k, v, dropout_p=p, causal=True, return_lse=True)
    elif call == "varlen":
        k, v = rand(350, hk, d), rand(350, hk, d)
        cu_q, cu_k = torch.tensor([0, 30, 80], dtype=torch.int32), torch.tensor([0, 100, 350], dtype=torch.int32)
        qv = q.reshape(b * sq, hq, d)

        def run():
            return flashattn_ext.flash_attn_varlen_func(qv, k, v, cu_q, cu_k, 50, 250, causal=True, return_lse=True)
    else:
        cap, blk = 512, 64
        kc, vc = rand(b, cap, hk, d), rand(b, cap, hk, d)
        seqlens = torch.tensor([300, 170], dtype=torch.int32)
        kw = dict(cache_seqlens=seqlens, causal=True, return_softmax_lse=True)
        if call == "kvcache_paged":
            kc, vc = kc.reshape(b * cap // blk, blk, hk, d), vc.reshape(b * cap // blk, blk, hk, d)
            kw["block_table"] = torch.randperm(b * cap // blk, generator=gen).to(torch.int32).reshape(b, cap // blk)
        else:
            kw["cache_batch_idx"] = torch.tensor([1, 0], dtype=torch.int32)

        def run():
            return flashattn_ext.flash_attn_with_kvcache(q, kc, vc, **kw)

    got = {}
    for mode in ("1", "step"):
        monkeypatch.setenv("FLASHATTN_EXT_CPU_AMX", mode)
        got[mode] = run()
    for name, a, f in zip(("out", "lse"), got["1"], got["step"]):
        assert torch.equal(a, f), name
