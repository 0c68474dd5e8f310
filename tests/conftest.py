"""Shared fixtures. References (float64, pure numpy) live in tests/reference.py."""

from __future__ import annotations

import importlib.util
import os
import secrets

import numpy as np
import pytest

HAS_TORCH = importlib.util.find_spec("torch") is not None


def _cuda_available() -> bool:
    if not HAS_TORCH:
        return False
    import torch

    return torch.cuda.is_available()


HAS_CUDA = _cuda_available()


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="no CUDA device on this machine (torch.cuda.is_available() is False)")
    skip_torch = pytest.mark.skip(reason="torch is not installed (ORT-only environment)")
    for item in items:
        # Markers, not item.keywords: keywords also hold the names of parent folders, so a
        # checkout in a folder named "cuda" or "torch" would skip everything.
        if item.get_closest_marker("cuda") is not None and not HAS_CUDA:
            item.add_marker(skip_cuda)
        if item.get_closest_marker("torch") is not None and not HAS_TORCH:
            item.add_marker(skip_torch)


def pytest_configure(config):
    config.addinivalue_line("markers", "torch: needs PyTorch (skipped in ORT-only environments)")


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A fresh generator per test. The seed is printed on failure; set OPBRIDGE_TEST_SEED to replay."""
    seed = int(os.environ.get("OPBRIDGE_TEST_SEED", secrets.randbits(32)))
    request.node.user_properties.append(("seed", seed))
    print(f"rng seed: {seed} (replay with OPBRIDGE_TEST_SEED={seed})")
    return np.random.default_rng(seed)
