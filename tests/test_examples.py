"""examples/rms_norm (RMSNorm made from the `opbridge new-op` scaffold: forward, backward,
float32/float64) builds with pip as a user builds it, and its own tests pass (check_op: opcheck,
gradcheck, gradgradcheck, both exporters, ONNX Runtime against torch)."""

from __future__ import annotations

import re

import pytest

import opbridge
from cmake_helpers import REPO
from scaffold_helpers import pip_install, run_project_tests, run_python

pytest.importorskip("torch", reason="the example's tests use torch")


@pytest.mark.slow  # a pip build of a torch extension plus exports: over a minute on 2 cores
def test_rms_norm_example(tmp_path):
    if not opbridge.build_info().get("torch_version"):
        pytest.skip("opbridge was built without torch: the example's torch extension cannot be built")
    project = REPO / "examples" / "rms_norm"
    pip_install(project, tmp_path / "site", tmp_path / "build")
    out = run_project_tests(project, tmp_path / "site")
    assert re.search(r"\b4 passed\b", out), out


def test_shapes_example(tmp_path):
    # In CI (about 40 s on 2 cores: one pip build, then the project's own tests).
    # Ops of other shapes than the scaffold's: an int64 index input and an attribute-sized output
    # (segment_sum), two outputs sized by an expression (window_stats, "x[0], x[1] // window"), an
    # output sized by the values (select_rows, "?, x[1]"), an optional input and a string attribute
    # (bias_act).
    if not opbridge.build_info().get("torch_version"):
        pytest.skip("opbridge was built without torch: the example's torch extension cannot be built")
    project = REPO / "examples" / "shapes"
    pip_install(project, tmp_path / "site", tmp_path / "build")
    out = run_project_tests(project, tmp_path / "site")
    assert re.search(r"\b13 passed\b", out), out
    # The README's Python block, as a user copies it.
    (block,) = re.findall(r"^```python\n(.*?)^```", (project / "README.md").read_text(), flags=re.S | re.M)
    (tmp_path / "readme.py").write_text(block)
    run_python([tmp_path / "readme.py"], tmp_path / "site", tmp_path)
    assert (tmp_path / "model.onnx").is_file()
