"""The package is typed: py.typed and opbridge/_core.pyi (generated from the built module by
nanobind's stubgen) are installed, mypy --strict passes on the typed modules as installed, and the
signatures of opbridge's public names hold no Any."""

from __future__ import annotations

import ast
import importlib.resources
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import opbridge

ROOT = Path(__file__).resolve().parents[2]
# Checked with `mypy --strict` (pyproject.toml's [tool.mypy]) as a user's project sees them: the
# installed package, _core through its stub. Packages are checked with every module in them.
TYPED_MODULES = ["opbridge", "opbridge._library", "opbridge._session", "opbridge._cmake", "opbridge._ort",
                 "opbridge._version", "opbridge._core", "opbridge.aoti", "opbridge.cli", "opbridge.testing"]
TYPED_PACKAGES = ["opbridge.ops", "opbridge.nn", "opbridge.onnx"]
# The examples' Python packages, from their sources (they use opbridge as a user's project does).
EXAMPLE_PACKAGES = sorted(p.parent for p in ROOT.glob("examples/*/python/*/__init__.py"))


def _installed(name: str) -> Path:
    return Path(str(importlib.resources.files("opbridge") / name))


def test_marker_and_core_stub_are_installed():
    assert _installed("py.typed").is_file()
    stub = _installed("_core.pyi")
    assert stub.is_file(), "opbridge/_core.pyi is missing: the build generates it (CMakeLists.txt)"
    from opbridge import _core

    tree = ast.parse(stub.read_text())
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    names |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert names == {n for n in vars(_core) if not n.startswith("__")} | {"__getattr__"}
    # run's signature is written in the pattern file: its parameters must still be the binding's.
    run = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run")
    signature = _core.run.__nb_signature__[0][0]
    params = signature[signature.index("(") + 1:signature.rindex(")")].split(",")
    assert [a.arg for a in run.args.args] == [p.split(":")[0].strip() for p in params]


def test_mypy_strict():
    pytest.importorskip("mypy")
    args = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
    for m in TYPED_MODULES:
        args += ["-m", m]
    for p in TYPED_PACKAGES:
        args += ["-p", p]
    r = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def test_examples_mypy_strict():
    # mypy takes modules or files in one run, not both: the examples' sources in a second run.
    pytest.importorskip("mypy")
    assert len(EXAMPLE_PACKAGES) >= 4, EXAMPLE_PACKAGES
    args = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
    r = subprocess.run(args + [str(p) for p in EXAMPLE_PACKAGES], capture_output=True, text=True, cwd=ROOT,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def test_public_signatures_hold_no_any():
    problems = []
    for name in opbridge.__all__:
        obj = getattr(opbridge, name)
        if not callable(obj):
            continue
        functions = [obj] if not inspect.isclass(obj) else [f for n, f in vars(obj).items()
                                                           if inspect.isfunction(f) and not n.startswith("_")]
        for f in functions:
            for param, annotation in f.__annotations__.items():
                if "Any" in str(annotation):
                    problems.append(f"opbridge.{name}: {param}: {annotation}")
    assert not problems, "\n".join(problems)


def test_ops_names_for_type_checkers_are_the_runtime_ones():
    # opbridge.ops re-exports each op module's __all__ in a loop, which type checkers do not run:
    # its `if TYPE_CHECKING:` block names them again, and must not fall behind.
    import opbridge.ops

    tree = ast.parse((ROOT / "python/opbridge/ops/__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    static = {a.asname or a.name for n in block.body if isinstance(n, ast.ImportFrom) for a in n.names}
    ops_modules = {n for n in opbridge.ops.__all__ if getattr(opbridge.ops, n).__module__.startswith("opbridge.ops.")
                   and not getattr(opbridge.ops, n).__module__.startswith("opbridge.ops._")}
    assert static == ops_modules
