"""python -m flashattn_ext: a self-check. Prints the versions, how this copy was built (CUDA archs),
which kernels each path uses on this machine, whether torch's flash-attention registry knows us, and
runs a correctness check of a few seconds (forward and backward on every device against
flashattn_ext.reference in float64). Exit status 0 when every check passes, 1 otherwise."""
import os
import sys
import time
import warnings

import torch

import flashattn_ext
from flashattn_ext._core import LIMITS
from flashattn_ext.integrations import torch_registry
from flashattn_ext.reference import attention_ref

# One configuration per check: GQA, causal with more keys than queries (bottom-right), odd lengths.
CHECK_SHAPE = dict(batch=2, seqlen_q=61, seqlen_k=96, nheads=4, nheads_kv=2)
CHECK_HEADDIM = {"cpu": 64, "cuda": 128}
CHECK_DTYPES = {"cpu": (torch.bfloat16, torch.float32), "cuda": (torch.bfloat16, torch.float32)}
# Relative L2 error against the float64 reference (out; gradients get twice as much).
CHECK_TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 4e-3}
# x86-64 feature levels of the CPU kernels' target_clones (csrc/cpu/flash_cpu.c), by /proc/cpuinfo flags.
ISA_LEVELS = (
    ("x86-64-v4 (AVX-512)", {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx2", "fma"}),
    ("x86-64-v3 (AVX2, FMA)", {"avx2", "fma", "bmi2", "f16c", "movbe"}),
)


def distribution_version():
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:
        return None
    try:
        return version("flashattn_ext")
    except PackageNotFoundError:
        return None


def cpu_isa():
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return "baseline (no /proc/cpuinfo to read the CPU's features)"
    for name, needed in ISA_LEVELS:
        if needed <= set(flags):
            return name
    return "baseline x86-64"


def report_build():
    info = torch_registry.build_info()
    dist = distribution_version()
    print(f"flashattn_ext {flashattn_ext.__version__}" + (f" (installed as {dist})" if dist else ""))
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}, Python {sys.version.split()[0]}")
    if info is None:
        print("build: no flashattn_ext/_build_info.py (built by an older setup.py): archs unknown")
        return
    archs = ", ".join(arch_name(a) for a in info.CUDA_ARCHS) or "none (CPU kernels only)"
    print(f"build: against torch {info.TORCH_VERSION}, CUDA {info.CUDA_VERSION or 'none'}; CUDA archs: {archs}")
    if info.TORCH_VERSION.split("+")[0] != torch.__version__.split("+")[0]:
        print(f"  warning: built against torch {info.TORCH_VERSION}, running with {torch.__version__}: rebuild")


def arch_name(arch):
    """sm_80 / sm_90a machine code, compute_80 PTX (compiled by the driver on newer GPUs), or both."""
    if arch.startswith("compute_"):
        return f"{arch} PTX"
    if arch.endswith("+PTX"):
        number = arch.removesuffix("+PTX")
        return f"sm_{number} + compute_{number} PTX"
    return f"sm_{arch}"


def report_cpu():
    threads = os.environ.get("OMP_NUM_THREADS") or f"{os.cpu_count()} (all cores; OMP_NUM_THREADS sets it)"
    amx = {"tiles": "; float16/bfloat16 products on AMX-BF16 tiles (csrc/cpu/amx.c)",
           "dp": "; the bfloat16 forward's products by AVX512-BF16 dot products (csrc/cpu/amx.c)"}.get(LIMITS["cpu_amx"], "")
    print("CPU: float32/float64 (float16/bfloat16 computed in float32) forward and backward: the C11 kernels of "
          f"csrc/cpu, OpenMP threads: {threads}; hot loops: {cpu_isa()}{amx}")


# Probes of the kernel report, per head dim: tiny bf16 calls whose kernels the extension records
# (_C.last_cuda_kernels, csrc/cuda/launch.cu), so the report is what runs, not a restatement of the dispatch.
PROBE_HEADDIMS = (64, 128, 256, 512)
PROBE_VARIANTS = (("dense causal", {"causal": True}), ("softcap", {"softcap": 30.0}),
                  ("dropout", {"dropout_p": 0.1}))


def probe_kernels(device, headdim, dtype=torch.bfloat16):
    """{variant: "forward + backward kernel files" or why the call raised} for one head dim on one device."""
    generator = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=device, dtype=dtype)

    found = {}
    for name, kwargs in PROBE_VARIANTS:
        q, k, v = (randn(1, 256, 2, headdim).requires_grad_() for _ in range(3))
        try:
            with warnings.catch_warnings():  # the float32 kernels' warning (csrc/ops_cuda.cpp half_on_fp32): named below
                warnings.simplefilter("ignore")
                flashattn_ext.flash_attn_func(q, k, v, **kwargs).sum().backward()
            fwd, bwd = flashattn_ext._C.last_cuda_kernels()
            found[name] = f"{fwd} + {bwd}"
        except Exception as error:  # a report says what raised, whatever it is
            found[name] = f"raises {type(error).__name__}"
    try:
        q, cache = randn(1, 1, 2, headdim), randn(1, 1024, 2, headdim)
        flashattn_ext.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=1000)
        found["decode"] = flashattn_ext._C.last_cuda_kernels()[0]
    except Exception as error:
        found["decode"] = f"raises {type(error).__name__}"
    return found


def report_cuda():
    if not torch.cuda.is_available():
        print("CUDA: no device")
        return []
    if not torch_registry.cuda_kernels_built():
        print("CUDA: this build has no CUDA kernels (built without a toolkit or with FLASHATTN_EXT_FORCE_CPU=1)")
        return []
    notes = [f"{name}={os.environ[name]}" for name in ("FLASHATTN_EXT_DISABLE_SM90", "FLASHATTN_EXT_DISABLE_DECODE",
                                                       "FLASHATTN_EXT_SMEM_LIMIT") if os.environ.get(name)]
    usable = []
    for index in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(index)
        smem = torch_registry.smem_per_block(index)
        print(f"CUDA device {index}: {torch.cuda.get_device_name(index)}, compute capability {major}.{minor}, "
              f"{smem // 1024} KB shared memory per block")
        error = torch_registry._cuda_device_error(index)
        if error is not None:
            print(f"  our kernels do not run here: {error}")
            continue
        usable.append(index)
        top = torch_registry.cuda_max_head_dim(smem)
        print(f"  fp16/bf16 tensor-core kernels, forward and backward: head dims up to {top}" if top else
              "  fp16/bf16 tensor-core kernels: none (too little shared memory)")
        large = f"{LIMITS['cuda_max_head_dim'] + 1}..{LIMITS['cuda_max_head_dim_fwd']}"
        print(f"  fp16/bf16 head dims {large}: the d512 tiles where they fit (not paged; the backward not "
              "deterministic), see d512 below")
        print(f"  fp16/bf16 calls no tensor-core tile serves, up to head dim {LIMITS['cuda_max_head_dim_fwd']}: "
              "the float32 kernels (simple.cu below; slower, a warning says so)")
        print("  kernels (csrc/cuda) of bf16 calls, forward + backward" + (f" ({', '.join(notes)})" if notes else "")
              + "; float32/float64: simple.cu")
        with torch.cuda.device(index):
            for headdim in PROBE_HEADDIMS:
                found = probe_kernels(f"cuda:{index}", headdim)
                print(f"    d{headdim}: " + "; ".join(f"{name}: {kernels}" for name, kernels in found.items()))
    return usable


def report_registry():
    attention = torch_registry._registry()
    if attention is None:
        print(f"torch flash-attention registry: not in torch {torch.__version__} (torch >= 2.10 has it)")
        return
    registered = torch_registry.NAME in attention.list_flash_attention_impls()
    active = attention.current_flash_attention_impl()
    print(f"torch flash-attention registry: {torch_registry.NAME!r} "
          f"{'registered' if registered else 'not registered'}; active implementation: {active or 'none'}")


def rel_error(x, ref):
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def check(device, dtype):
    """Forward and backward against the float64 reference; returns (passed, message)."""
    s = CHECK_SHAPE
    headdim = CHECK_HEADDIM[torch.device(device).type]
    generator = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    q64 = randn(s["batch"], s["seqlen_q"], s["nheads"], headdim)
    k64 = randn(s["batch"], s["seqlen_k"], s["nheads_kv"], headdim)
    v64 = randn(s["batch"], s["seqlen_k"], s["nheads_kv"], headdim)
    dout64 = randn(s["batch"], s["seqlen_q"], s["nheads"], headdim)
    leaves = [t.to(device=device, dtype=dtype).requires_grad_() for t in (q64, k64, v64)]
    out, lse = flashattn_ext.flash_attn_func(*leaves, causal=True, return_lse=True)
    out.backward(dout64.to(device=device, dtype=dtype))
    # The reference sees the inputs as rounded to dtype.
    refs = [t.detach().cpu().double().requires_grad_() for t in leaves]
    ref_out, ref_lse = attention_ref(*refs, causal=True)
    ref_out.backward(dout64)
    tol = CHECK_TOL[dtype]
    errors = {"out": (rel_error(out.detach().cpu(), ref_out.detach()), tol),
              "lse": (rel_error(lse.cpu(), ref_lse.detach()), tol)}
    for name, leaf, ref in zip(("dq", "dk", "dv"), leaves, refs):
        errors[name] = (rel_error(leaf.grad.cpu(), ref.grad), 2 * tol)
    passed = all(err <= limit for err, limit in errors.values())
    worst = max(errors, key=lambda name: errors[name][0] / errors[name][1])
    return passed, f"worst relative error {errors[worst][0]:.1e} ({worst}; limit {errors[worst][1]:.0e})"


def run_checks(cuda_devices):
    targets = [("cpu", dtype) for dtype in CHECK_DTYPES["cpu"]]
    targets += [(f"cuda:{i}", dtype) for i in cuda_devices for dtype in CHECK_DTYPES["cuda"]]
    failures = 0
    for device, dtype in targets:
        start = time.perf_counter()
        try:
            passed, message = check(device, dtype)
        except Exception as error:  # a self-check reports every failure, whatever it is
            passed, message = False, f"raised {type(error).__name__}: {error}"
        failures += not passed
        shape = "x".join(str(v) for v in CHECK_SHAPE.values())
        print(f"check {device} {str(dtype).replace('torch.', '')} causal GQA {shape} "
              f"d{CHECK_HEADDIM[torch.device(device).type]} forward+backward: {'ok' if passed else 'FAILED'}, "
              f"{message} ({time.perf_counter() - start:.2f} s)")
    return failures


def main():
    start = time.perf_counter()
    report_build()
    report_cpu()
    cuda_devices = report_cuda()
    report_registry()
    failures = run_checks(cuda_devices)
    verdict = "all checks passed" if failures == 0 else f"{failures} check(s) FAILED"
    print(f"{verdict} in {time.perf_counter() - start:.1f} s")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
