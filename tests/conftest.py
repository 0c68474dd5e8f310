"""Shared fixtures. References (float64, pure numpy) live in tests/helpers/reference.py."""

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


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="also run tests marked slow (or set OPBRIDGE_RUN_SLOW=1)")


def _run_slow(config) -> bool:
    # Selecting them explicitly (-m slow) also runs them.
    return (config.getoption("--run-slow") or os.environ.get("OPBRIDGE_RUN_SLOW") == "1"
            or "slow" in (config.getoption("-m") or ""))


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="no CUDA device on this machine (torch.cuda.is_available() is False)")
    skip_torch = pytest.mark.skip(reason="torch is not installed (ORT-only environment)")
    skip_slow = pytest.mark.skip(reason="slow: run with --run-slow or OPBRIDGE_RUN_SLOW=1")
    # pytest-xdist workers run tests side by side: a memory measurement would count its neighbours;
    # under AddressSanitizer (scripts/sanitize.sh) memory is the sanitizer's, not the program's.
    skip_serial = pytest.mark.skip(reason="serial: measures memory and needs the machine to itself; "
                                          "not run under pytest-xdist or AddressSanitizer (run alone: the README's "
                                          "test command runs them after the suite, with -m serial)")
    parallel = os.environ.get("PYTEST_XDIST_WORKER") is not None or "asan" in os.environ.get("LD_PRELOAD", "")
    run_slow = _run_slow(config)
    for item in items:
        # Markers, not item.keywords: keywords also hold the names of parent folders, so a
        # checkout in a folder named "cuda" or "torch" would skip everything.
        if item.get_closest_marker("cuda") is not None and not HAS_CUDA:
            item.add_marker(skip_cuda)
        if item.get_closest_marker("torch") is not None and not HAS_TORCH:
            item.add_marker(skip_torch)
        if "slow" in item.keywords and not run_slow:
            item.add_marker(skip_slow)
        if item.get_closest_marker("serial") is not None and parallel:
            item.add_marker(skip_serial)


def pytest_configure(config):
    config.addinivalue_line("markers", "torch: needs PyTorch (skipped in ORT-only environments)")


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A fresh generator per test. The seed is printed on failure; set OPBRIDGE_TEST_SEED to replay."""
    seed = int(os.environ.get("OPBRIDGE_TEST_SEED", secrets.randbits(32)))
    request.node.user_properties.append(("seed", seed))
    print(f"rng seed: {seed} (replay with OPBRIDGE_TEST_SEED={seed})")
    return np.random.default_rng(seed)


@pytest.fixture(params=["baseline", "avx2", "avx512"])
def torch_isa(request):
    """Runs the test with the torch library's CPU kernels at one instruction-set level (skipped
    where this CPU or build lacks it) and restores the previous level afterwards."""
    torch = pytest.importorskip("torch")
    import opbridge.ops  # noqa: F401  (loads the torch ops)

    before = torch.ops.opbridge._cpu_isa()
    got = torch.ops.opbridge._set_cpu_isa(request.param)
    if got != request.param:
        torch.ops.opbridge._set_cpu_isa(before)
        pytest.skip(f"this CPU/build lacks {request.param}")
    yield request.param
    torch.ops.opbridge._set_cpu_isa(before)
