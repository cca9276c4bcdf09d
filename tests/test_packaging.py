"""Packaging: the version string, the generated build record, and `python -m flashattn_ext` (the
self-check) running to exit status 0 on this machine."""
import os
import re
import subprocess
import sys

import flashattn_ext
from flashattn_ext.integrations import torch_registry

# The directory holding the flashattn_ext this process imported (the source tree or site-packages):
# the subprocess must run that same copy.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(flashattn_ext.__file__)))
# PEP 440 release with an optional pre/post/dev part (the build adds a +torchX.Y.variant local label
# to the distribution's version only).
VERSION = re.compile(r"^\d+\.\d+\.\d+((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?$")


def test_version_string():
    assert VERSION.match(flashattn_ext.__version__), flashattn_ext.__version__


def test_build_info_when_present():
    info = torch_registry.build_info()
    if info is None:
        return  # a build by an older setup.py
    assert isinstance(info.TORCH_VERSION, str) and info.TORCH_VERSION
    assert all(re.match(r"^(\d+a?(\+PTX)?|compute_\d+)$", a) for a in info.CUDA_ARCHS)
    assert (info.CUDA_VERSION is None) == (len(info.CUDA_ARCHS) == 0)
    assert bool(info.CUDA_ARCHS) == torch_registry.cuda_kernels_built()


def test_self_check_runs_and_passes():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [PACKAGE_PARENT, os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-m", "flashattn_ext"], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert out.startswith(f"flashattn_ext {flashattn_ext.__version__}")
    assert "CPU: float32/float64" in out and "check cpu float32" in out and "check cpu bfloat16" in out
    assert "all checks passed" in out
