"""Builds the one extension flashattn_ext._C, against the installed torch (build with
--no-build-isolation: `pip install --no-build-isolation .`, `python -m build --wheel --no-isolation`).

- csrc/cpu/*.c is compiled as real C (cc -std=c11 -O3 -fopenmp) into objects linked into _C.
- csrc/ops.cpp (schema + CPU backend) is compiled as C++ against libtorch.
- csrc/ops_cuda.cpp and csrc/cuda/*.cu are added when torch is a CUDA build and a CUDA toolkit is
  found, unless FLASHATTN_EXT_FORCE_CPU=1. FLASHATTN_EXT_CUDA_ARCHS picks the targets, ";"-separated:
  "NN" sm_NN machine code, "NN+PTX" that and compute_NN PTX, "compute_NN" the PTX alone, "90a" the Hopper
  (wgmma) kernels. Default "80+PTX;90a": sm_80 and sm_90a machine code, and compute_80 PTX, which the driver
  compiles for GPUs newer than both (Blackwell sm_100 / sm_120) on their first call (cached after).
- _C uses only CPython's limited API (its one Python symbol is PyInit__C; the ops reach Python through
  torch's dispatcher), so the wheel is abi3: one wheel per platform and torch version, for every
  CPython from the version torch's limited-API macro names. libtorch's C++ ABI is not stable across
  torch releases: the wheel requires the torch minor release it was built against, and its version
  carries that in a local label (0.1.0+torch2.14.cu130).
- flashattn_ext/_build_info.py (generated, not tracked) records the torch, CUDA version and archs of
  the build for `python -m flashattn_ext` and the registry's device checks.
No network is used.
"""
import glob
import os
import re
import shutil
import subprocess
import sys

from setuptools import setup


def locate_cuda_toolkit():
    """Sets CUDA_HOME to a toolkit with headers when the user did not: torch guesses it from the
    nvcc on PATH, which may be a wrapper script outside the toolkit (e.g. /usr/local/bin/nvcc)."""
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return
    nvcc = shutil.which("nvcc")
    candidates = [os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))] if nvcc else []
    candidates += ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    for root in candidates:
        if os.path.isfile(os.path.join(root, "include", "cuda_runtime_api.h")) and os.path.isfile(
            os.path.join(root, "bin", "nvcc")
        ):
            os.environ["CUDA_HOME"] = root
            return


locate_cuda_toolkit()

try:
    import torch  # noqa: E402  (after CUDA_HOME is settled: cpp_extension reads it at import)
except ImportError:
    sys.exit("flashattn_ext builds against the installed torch: install torch first, then build without "
             "build isolation (pip install --no-build-isolation .)")
from torch.utils import cpp_extension  # noqa: E402
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension  # noqa: E402

ROOT = os.path.dirname(os.path.abspath(__file__))
C_SOURCES = sorted(glob.glob("csrc/cpu/*.c"))
# nvcc / g++ seconds on the 2-core machine: fwd_sm90.cu ~115, bwd_sm80.cu ~70, fwd_sm80.cu ~42, ops.cpp ~32 (the rest
# below 30 each); BuildWithC starts them first
LONGEST_FIRST = ("fwd_sm90.cu", "bwd_sm80.cu", "fwd_sm80.cu", "ops.cpp")
C_FLAGS = ["-std=c11", "-O3", "-fopenmp", "-fPIC", "-Wall", "-Wextra", "-Icsrc"]
CXX_FLAGS = ["-O3", "-fopenmp"]  # the C++ standard is the one torch asks for
NVCC_FLAGS = ["-O3", "--expt-relaxed-constexpr", "-lineinfo"]
# The oldest CPython whose limited API _C uses: torch's choice where it makes one (it then defines
# Py_LIMITED_API itself for py_limited_api extensions), else 3.9.
LIMITED_API_HEX = getattr(cpp_extension, "min_supported_cpython", None)
LIMITED_API = int(LIMITED_API_HEX or "0x03090000", 16)
ABI3_TAG = f"cp{LIMITED_API >> 24}{(LIMITED_API >> 16) & 0xFF}"
BUILD_INFO = os.path.join(ROOT, "flashattn_ext", "_build_info.py")


def env_flag(name):
    return os.environ.get(name, "0") not in ("", "0")


def cuda_enabled():
    if env_flag("FLASHATTN_EXT_FORCE_CPU"):
        return False
    return torch.version.cuda is not None and CUDA_HOME is not None


ARCH_TOKEN = re.compile(r"^(?:(\d+a?)(\+PTX)?|compute_(\d+))$")


def cuda_archs():
    archs = [a for a in os.environ.get("FLASHATTN_EXT_CUDA_ARCHS", "80+PTX;90a").replace(",", ";").split(";") if a]
    bad = [a for a in archs if not ARCH_TOKEN.match(a)]
    if bad:
        raise SystemExit(f"FLASHATTN_EXT_CUDA_ARCHS: {bad} not of the forms NN, NN+PTX, compute_NN, 90a")
    return archs


def gencode_flags():
    """-gencode per arch (machine code, PTX or both); with 90a also FLASHATTN_EXT_SM90A, which enables the
    Hopper (wgmma) kernels."""
    archs = cuda_archs()
    flags = []
    for a in archs:
        sm, ptx, ptx_only = ARCH_TOKEN.match(a).groups()
        if ptx_only:
            flags.append(f"-gencode=arch=compute_{ptx_only},code=compute_{ptx_only}")
        else:
            code = f"[sm_{sm},compute_{sm}]" if ptx else f"sm_{sm}"
            flags.append(f"-gencode=arch=compute_{sm},code={code}")
    if "90a" in archs:
        flags.append("-DFLASHATTN_EXT_SM90A")
    return flags


class BuildWithC(BuildExtension):
    """Compiles the C sources with the C compiler (torch's build would hand them to g++ as C++), and
    removes the _C.cpython-*.so an in-place build made before _C became abi3: Python would import it
    ahead of the new _C.abi3.so."""

    def build_extensions(self):
        cc = os.environ.get("CC", "cc")
        obj_dir = os.path.join(self.build_temp, "c_objects")
        os.makedirs(obj_dir, exist_ok=True)
        objects = []
        for src in C_SOURCES:
            obj = os.path.join(obj_dir, os.path.basename(src) + ".o")
            subprocess.check_call([cc, *C_FLAGS, "-c", os.path.join(ROOT, src), "-o", obj], cwd=ROOT)
            objects.append(obj)
        for ext in self.extensions:
            ext.extra_objects = list(ext.extra_objects or []) + objects
        super().build_extensions()
        for stale in glob.glob(os.path.join(ROOT, "flashattn_ext", "_C.cpython-*")):
            os.remove(stale)

    def build_extension(self, ext):
        """The longest compiles first (LONGEST_FIRST): distutils sorts the sources by name and ninja starts them in
        that order, which put fwd_sm90.cu (~2 of the build's 3 minutes on 2 cores) last and left the other job idle."""
        compile_ = self.compiler.compile

        def longest_first(sources, *args, **kwargs):
            rank = lambda s: next((i for i, n in enumerate(LONGEST_FIRST) if s.endswith(n)), len(LONGEST_FIRST))
            return compile_(sorted(sources, key=lambda s: (rank(s), s)), *args, **kwargs)

        self.compiler.compile = longest_first
        try:
            super().build_extension(ext)
        finally:
            self.compiler.compile = compile_


def extension(with_cuda):
    sources = ["csrc/ops.cpp"]
    cxx_flags = list(CXX_FLAGS)
    if LIMITED_API_HEX is None:
        cxx_flags.append(f"-DPy_LIMITED_API={LIMITED_API:#010x}")
    kwargs = dict(
        name="flashattn_ext._C",
        include_dirs=[os.path.join(ROOT, "csrc")],
        extra_link_args=["-fopenmp"],
        py_limited_api=True,
    )
    if with_cuda:
        sources += ["csrc/ops_cuda.cpp"] + sorted(glob.glob("csrc/cuda/*.cu"))
        # FLASHATTN_EXT_CUDA: ops.cpp's limits() reads the kernels' shared-memory needs (launch.h)
        kwargs["extra_compile_args"] = {"cxx": cxx_flags + ["-DFLASHATTN_EXT_CUDA"],
                                        "nvcc": NVCC_FLAGS + gencode_flags()}
        return CUDAExtension(sources=sources, **kwargs)
    kwargs["extra_compile_args"] = {"cxx": cxx_flags}
    return CppExtension(sources=sources, **kwargs)


def torch_release():
    """"2.14" of torch "2.14.1+cu130"."""
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def version(with_cuda):
    """The package version with the build's torch release and CUDA version as a local label."""
    with open(os.path.join(ROOT, "flashattn_ext", "__init__.py")) as f:
        base = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)
    variant = "cu" + torch.version.cuda.replace(".", "") if with_cuda else "cpu"
    return f"{base}+torch{torch_release()}.{variant}"


def write_build_info(with_cuda):
    """flashattn_ext/_build_info.py, rewritten only when its content changes."""
    text = (
        '"""Written by setup.py: how this copy of flashattn_ext was built (generated, not tracked)."""\n'
        f"TORCH_VERSION = {torch.__version__!r}  # the torch it was compiled against\n"
        f"CUDA_VERSION = {torch.version.cuda if with_cuda else None!r}  # None: no CUDA kernels\n"
        f"CUDA_ARCHS = {tuple(cuda_archs()) if with_cuda else ()!r}  # NN / 90a: sm_NN code; +PTX / compute_NN: PTX\n"
    )
    try:
        with open(BUILD_INFO) as f:
            if f.read() == text:
                return
    except OSError:
        pass
    with open(BUILD_INFO, "w") as f:
        f.write(text)


def torch_requirement():
    """The torch minor release the build links against (its C++ ABI changes between releases)."""
    major, minor = (int(x) for x in torch_release().split("."))
    return f"torch>={major}.{minor},<{major}.{minor + 1}"


WITH_CUDA = cuda_enabled()
write_build_info(WITH_CUDA)
setup(
    version=version(WITH_CUDA),
    install_requires=[torch_requirement()],
    ext_modules=[extension(WITH_CUDA)],
    cmdclass={"build_ext": BuildWithC},
    options={"bdist_wheel": {"py_limited_api": ABI3_TAG}},
)
