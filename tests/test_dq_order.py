"""The deterministic backward's ordered dQ additions (Hopper, csrc/cuda/bwd_sm90.cu dq_order), simulated on
the host over csrc/mask.h's geometry by tests/dq_order_sim.c: exact tile ranges, contiguous key tiles per
query tile, no deadlock under in-order dispatch onto few resident CTAs in random interleavings, and every
query tile's additions in descending key-tile order, with and without hidden (attn_mask) tiles. Needs a C
compiler (as the build does); the GPU tests run the kernels themselves."""
import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
COMPILER = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


@pytest.mark.skipif(COMPILER is None, reason="needs a C compiler")
def test_dq_order_simulation(tmp_path):
    exe = tmp_path / "dq_order_sim"
    subprocess.run([COMPILER, "-O2", "-std=c11", "-Wall", "-Werror", f"-I{ROOT / 'csrc'}",
                    str(ROOT / "tests" / "dq_order_sim.c"), "-o", str(exe), "-lm"], check=True)
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    last = result.stdout.split()
    assert last[:1] == ["ok"] and int(last[1]) > 1000, result.stdout
