"""Fuzzing the torch ops, fast subset (200 cases per op): non-contiguous, channels-last, expanded
(stride 0) and zero-size inputs, requires_grad (gradients checked), wrong dtypes and devices,
non-finite data; run in a child worker process, judged like the ORT cases (tests/fuzz/oracle.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from fuzz import harness  # noqa: E402
from fuzz.ops import OPS  # noqa: E402
from fuzz.pytest_support import run_fuzz  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def worker():
    with harness.Worker(modules=("torch",)) as w:
        yield w


@pytest.mark.parametrize("op", sorted(OPS))
def test_fuzz_torch_op(op, worker):
    run_fuzz(OPS[op], "torch", worker)
