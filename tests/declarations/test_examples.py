"""examples/rms_norm (RMSNorm made from the `opbridge new-op` scaffold: forward, backward,
float32/float64) builds with pip as a user builds it, and its own tests pass (check_op: opcheck,
gradcheck, gradgradcheck, both exporters, ONNX Runtime against torch). It stays what the scaffold
makes today wherever RMSNorm needs nothing else, and registers its gradient as the scaffold does."""

from __future__ import annotations

import ast
import re

import pytest

import opbridge
from opbridge._newop import _PLAIN_VALUES
from helpers import elf
from helpers.elf import C_ABI
from helpers.cmake_helpers import REPO
from helpers.scaffold_helpers import pip_install, run_project_tests, run_readme_block

EXAMPLE = REPO / "examples" / "rms_norm"
# What RMSNorm changes in the scaffold of `opbridge new-op rms_norm --namespace myops`.
WRITTEN = ("ops/rms_norm/", "python/myops/ops/rms_norm.py", "tests/")


def test_rms_norm_example_is_the_scaffold_of_today(tmp_path):
    from opbridge._newop import new_op

    scaffold = new_op("rms_norm", dir=tmp_path / "myops", namespace="myops").dir
    generated = sorted(str(f.relative_to(scaffold)) for f in scaffold.rglob("*") if f.is_file())
    kept = [f for f in generated if not f.startswith(WRITTEN)]
    assert kept and all((EXAMPLE / f).is_file() for f in generated)
    differ = [f for f in kept if (EXAMPLE / f).read_bytes() != (scaffold / f).read_bytes()]
    assert not differ, f"examples/rms_norm differs from what new-op makes today in {differ}"


def _register_gradient_call(source: str) -> tuple:
    calls = [n for n in ast.walk(ast.parse(source))
             if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "register_gradient"]
    assert len(calls) == 1
    return [ast.literal_eval(a) for a in calls[0].args], sorted(k.arg for k in calls[0].keywords)


def test_rms_norm_example_registers_its_gradient_as_the_scaffold_does():
    template = (REPO / "python" / "opbridge" / "_templates" / "new_op" / "project" / "op.py.tmpl").read_text()
    template = template.replace("@ns@", "myops").replace("@op@", "rms_norm")
    for key, value in _PLAIN_VALUES.items():  # the scaffold without --index-output
        template = template.replace(f"@{key}@", value)
    example = (EXAMPLE / "python" / "myops" / "ops" / "rms_norm.py").read_text()
    assert _register_gradient_call(example) == _register_gradient_call(template) == (["myops::rms_norm"],
                                                                                     ["differentiable"])


pytest.importorskip("torch", reason="the example's tests use torch")


@pytest.mark.slow  # a pip build of a torch extension plus exports: over a minute on 2 cores
def test_rms_norm_example(tmp_path):
    if not opbridge.build_info().get("torch_version"):
        pytest.skip("opbridge was built without torch: the example's torch extension cannot be built")
    project = EXAMPLE
    pip_install(project, tmp_path / "site", tmp_path / "build")
    out = run_project_tests(project, tmp_path / "site")
    assert re.search(r"\b5 passed\b", out), out


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
    # A user's libraries, as opbridge_add_op links them, export their entry points only.
    libs = {p.name: elf.exported(p) for p in (tmp_path / "site").rglob("lib*.so")}
    assert set(libs) == {"libshapes_ort.so", "libshapes_torch.so"}, libs
    assert libs["libshapes_ort.so"] == {"RegisterCustomOps"} | C_ABI and libs["libshapes_torch.so"] == C_ABI, libs
    out = run_project_tests(project, tmp_path / "site")
    assert re.search(r"\b13 passed\b", out), out
    # The README's Python block, as a user copies it.
    run_readme_block(project, tmp_path / "site", tmp_path)
    assert (tmp_path / "model.onnx").is_file()


def test_index_ops_example(tmp_path):
    # In CI (about 40 s on 2 cores: one pip build, then the project's own tests).
    # Ops that return int64 indices: a segment maximum with its argmax (an output without a
    # gradient, which the declared backward takes from the forward) and a radius search (an int64
    # output of float inputs, a float attribute used as float32 in torch as in ONNX Runtime).
    if not opbridge.build_info().get("torch_version"):
        pytest.skip("opbridge was built without torch: the example's torch extension cannot be built")
    project = REPO / "examples" / "index_ops"
    pip_install(project, tmp_path / "site", tmp_path / "build")
    out = run_project_tests(project, tmp_path / "site")
    assert re.search(r"\b8 passed\b", out), out
    # The README's Python block, as a user copies it, and ONNX Runtime's outputs are torch's.
    run_readme_block(project, tmp_path / "site", tmp_path, check=(
        "import numpy as np\n"
        "np.testing.assert_array_equal(argmax_ort, argmax.numpy())\n"
        "np.testing.assert_allclose(y_ort, y.numpy(), rtol=1e-6)\n"
        "assert near.shape == (4, 8) and near.dtype == torch.int64\n"
        "print('same result')\n"))
