"""The point-cloud ops' fuzzing at length (tests/fuzz/ops/point_cloud.py; the default suite runs
OPBRIDGE_FUZZ_CASES of each kind through tests/test_fuzz_ort.py and tests/test_fuzz_torch.py):
many more cases of the seven ops in ORT, torch and the fake kernel, behind --run-slow."""

from __future__ import annotations

import pytest
from fuzz import harness
from fuzz.ops import point_cloud
from fuzz.pytest_support import run_fuzz

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("kind", ["ort", pytest.param("torch", marks=pytest.mark.torch)])
def test_fuzz_point_cloud_long(kind):
    if kind == "torch":
        pytest.importorskip("torch")
    with harness.Worker(modules=(kind,)) as worker:
        run_fuzz(point_cloud, kind, worker, cases=2000)
