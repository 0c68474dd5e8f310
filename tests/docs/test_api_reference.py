"""The API reference (docs/api.md): every public name (the ``__all__`` of opbridge, opbridge.ops,
opbridge.nn, opbridge.onnx, opbridge.testing, opbridge.aoti) has a docstring, as pdoc, which
builds the reference, reads it: a function's or class's own, a constant's the string literal after
its assignment, in the module that assigns it (a name imported from another module is followed
there)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect

import pytest

pytest.importorskip("torch")
pdoc_doc = pytest.importorskip("pdoc.doc")

MODULES = ["opbridge", "opbridge.ops", "opbridge.nn", "opbridge.onnx", "opbridge.testing", "opbridge.aoti"]
# Submodules the facade lists in __all__ (each is checked as a module of its own).
SUBMODULES = {"nn", "ops", "onnx"}


def _docstring(module_name: str, name: str, depth: int = 0) -> str:
    """The docstring pdoc gives ``name`` in ``module_name``, following ``from X import name``."""
    module = importlib.import_module(module_name)
    member = pdoc_doc.Module(module).members.get(name)
    if member is not None and member.docstring.strip():
        return member.docstring
    if depth > 4:
        return ""
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.ImportFrom) and any(a.name == name and a.asname is None for a in node.names):
            package = module_name if module.__file__.endswith("__init__.py") else module_name.rpartition(".")[0]
            origin = importlib.util.resolve_name("." * node.level + (node.module or ""), package) \
                if node.level else node.module
            return _docstring(origin, name, depth + 1)
    return ""


@pytest.mark.torch
@pytest.mark.parametrize("name", MODULES)
def test_every_public_name_has_a_docstring(name):
    module = importlib.import_module(name)
    assert pdoc_doc.Module(module).docstring.strip(), f"{name} has no module docstring"
    public = [n for n in module.__all__ if not (n.startswith("__") or (name == "opbridge" and n in SUBMODULES))]
    missing = [n for n in public if not _docstring(name, n)]
    assert not missing, f"{name}: public names without a docstring: {missing}"
