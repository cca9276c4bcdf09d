"""pytest configuration for the flashattn_ext suite.

The shared test helpers (the independent float64 reference, the `SAMPLES` configuration list, input
builders, tolerances) live in tests/fa_testing.py; this file puts tests/ on sys.path so that every
test module can import it whatever pytest import mode is configured.
"""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slow: takes tens of seconds (inductor compile, multi-GiB CUDA tensors); runs by default and "
        "in CI, deselect locally with -m 'not slow'",
    )
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped when none is present)")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
