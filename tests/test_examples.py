"""examples/rms_norm (RMSNorm made from the `opbridge new-op` scaffold: forward, backward,
float32/float64) builds with pip as a user builds it, and its own tests pass (check_op: opcheck,
gradcheck, gradgradcheck, both exporters, ONNX Runtime against torch)."""

from __future__ import annotations

import re

import pytest

import opbridge
from cmake_helpers import REPO
from scaffold_helpers import pip_install, run_project_tests

pytest.importorskip("torch", reason="the example's tests use torch")


@pytest.mark.slow  # a pip build of a torch extension plus exports: over a minute on 2 cores
def test_rms_norm_example(tmp_path):
    if not opbridge.build_info().get("torch_version"):
        pytest.skip("opbridge was built without torch: the example's torch extension cannot be built")
    project = REPO / "examples" / "rms_norm"
    pip_install(project, tmp_path / "site", tmp_path / "build")
    out = run_project_tests(project, tmp_path / "site")
    assert re.search(r"\b4 passed\b", out), out
