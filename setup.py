"""Builds the one extension flashattn_ext._C.

- csrc/cpu/*.c is compiled as real C (cc -std=c11 -O3 -fopenmp) into objects linked into _C.
- csrc/ops.cpp (schema + CPU backend) is compiled as C++ against libtorch.
- csrc/ops_cuda.cpp and csrc/cuda/*.cu are added when torch is a CUDA build and a CUDA toolkit is
  found, unless FLASHATTN_EXT_FORCE_CPU=1. FLASHATTN_EXT_CUDA_ARCHS picks the targets
  (default "80;90a": sm_80 machine code, and sm_90a for Hopper).
No network is used.
"""
import glob
import os
import shutil
import subprocess

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

import torch  # noqa: E402  (after CUDA_HOME is settled: cpp_extension reads it at import)
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension  # noqa: E402

ROOT = os.path.dirname(os.path.abspath(__file__))
C_SOURCES = sorted(glob.glob("csrc/cpu/*.c"))
C_FLAGS = ["-std=c11", "-O3", "-fopenmp", "-fPIC", "-Wall", "-Wextra", "-Icsrc"]
CXX_FLAGS = ["-O3", "-fopenmp"]  # the C++ standard is the one torch asks for
NVCC_FLAGS = ["-O3", "--expt-relaxed-constexpr", "-lineinfo"]


def env_flag(name):
    return os.environ.get(name, "0") not in ("", "0")


def cuda_enabled():
    if env_flag("FLASHATTN_EXT_FORCE_CPU"):
        return False
    return torch.version.cuda is not None and CUDA_HOME is not None


def gencode_flags():
    """-gencode per arch; with 90a also FLASHATTN_EXT_SM90A, which enables the Hopper (wgmma) kernels."""
    archs = [a for a in os.environ.get("FLASHATTN_EXT_CUDA_ARCHS", "80;90a").replace(",", ";").split(";") if a]
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    if "90a" in archs:
        flags.append("-DFLASHATTN_EXT_SM90A")
    return flags


class BuildWithC(BuildExtension):
    """Compiles the C sources with the C compiler (torch's build would hand them to g++ as C++)."""

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


def extension():
    sources = ["csrc/ops.cpp"]
    kwargs = dict(
        name="flashattn_ext._C",
        include_dirs=[os.path.join(ROOT, "csrc")],
        extra_link_args=["-fopenmp"],
    )
    if cuda_enabled():
        sources += ["csrc/ops_cuda.cpp"] + sorted(glob.glob("csrc/cuda/*.cu"))
        kwargs["extra_compile_args"] = {"cxx": CXX_FLAGS, "nvcc": NVCC_FLAGS + gencode_flags()}
        return CUDAExtension(sources=sources, **kwargs)
    kwargs["extra_compile_args"] = {"cxx": CXX_FLAGS}
    return CppExtension(sources=sources, **kwargs)


setup(
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildWithC},
)
