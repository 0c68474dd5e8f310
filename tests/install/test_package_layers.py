"""The Python package is layered, without import cycles:

    core (declarations, library paths)  ->  ops / onnx (and nn, the ORT session)  ->  optimize / CLI

A module imports only modules of its own layer or below, and no chain of imports leads from a
module back to itself. Every import counts: at module level or inside a function (a lazy import is
still a dependency), ``import x``, ``from x import y`` and ``importlib.import_module("x")``.
Read from the source files (nothing is imported), so this runs without a build.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "python" / "opbridge"

# Layer of each module (the longest matching prefix decides); the package itself (its
# __init__.py) is the facade on top.
LAYERS = {
    # core: what every layer above reads: declarations, paths, versions
    "opbridge._version": 0,
    "opbridge._library": 0,
    "opbridge._cmake": 0,
    "opbridge._declarations": 0,  # the op declaration model
    "opbridge._c_abi": 0,  # the C ABI as ctypes sees it
    "opbridge._op_library": 0,  # the op libraries opbridge knows
    "opbridge._discovery": 0,  # libraries announced by installed packages
    "opbridge._core": 0,
    "opbridge._ort": 0,  # finding onnxruntime (or saying which extra installs it)
    "opbridge._memory": 0,  # how much memory the machine has for a job
    "opbridge._protobuf": 0,  # walking protobuf messages in place
    # the frameworks: torch ops and modules, ONNX export, the ORT session
    "opbridge.ops": 1,
    "opbridge.nn": 1,
    "opbridge.onnx": 1,
    "opbridge._session": 1,
    "opbridge._op_package": 1,  # a package of one's own ops (its ORT side and torch side)
    # what uses them: optimize, check, the command line, the testing helpers, the facade
    "opbridge._optimize": 2,
    "opbridge._check": 2,
    "opbridge._demo": 2,
    "opbridge._newop": 2,
    "opbridge.cli": 2,
    "opbridge.__main__": 2,
    "opbridge.testing": 2,
    "opbridge": 2,
}
NAMES = {0: "core", 1: "ops/onnx", 2: "optimize/CLI"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return modules[name].name == "__init__.py"


def _resolve(name: str, level: int, current: str, modules: dict[str, Path]) -> str:
    if level == 0:
        return name
    base = current.split(".") if _is_package(current, modules) else current.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


# Modules the build makes (not in the source tree): the nanobind extension, the version file.
_BUILT = {"opbridge._core", "opbridge._version"}


def _target(name: str, modules: dict[str, Path]) -> str | None:
    """The opbridge module an import of ``name`` loads (its longest known prefix), or None."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules or candidate in _BUILT:
            return candidate
        parts.pop()
    return None


def _imports(current: str, path: Path, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module or "", node.level, current, modules)
            # `from .pkg import sub`: the submodule where the name is one (the package itself is
            # loaded anyway, as the submodule's parent); the package where a name is its own.
            subs = [f"{base}.{a.name}" for a in node.names if _target(f"{base}.{a.name}", modules) == f"{base}.{a.name}"]
            names = subs if len(subs) == len(node.names) else [base, *subs]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            text = node.args[0].value
            if text.startswith("."):
                level = len(text) - len(text.lstrip("."))
                text = _resolve(text.lstrip("."), level, current, modules)
            elif "{" in text:
                continue
            names = [text]
        for n in names:
            t = _target(n, modules)
            if t is not None and t != current:
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _layer(module: str) -> int:
    best = max((k for k in LAYERS if module == k or module.startswith(k + ".")), key=len, default=None)
    if best is None:
        raise AssertionError(f"{module} has no layer: add it to LAYERS in {Path(__file__).name}")
    return LAYERS[best]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each as a cycle path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(_cycle_path(sorted(comp), graph))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _cycle_path(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One cycle through the component's first module, for the message."""
    members = set(component)
    start = component[0]
    path, seen = [start], {start}
    while True:
        nxt = sorted(w for w in graph[path[-1]] if w in members)
        back = [w for w in nxt if w == start]
        if back and len(path) > 1:
            return path + [start]
        fresh = [w for w in nxt if w not in seen]
        if not fresh:
            return path + [nxt[0]]
        path.append(fresh[0])
        seen.add(fresh[0])


def test_every_module_has_a_layer():
    for module in _modules():
        _layer(module)


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles:\n" + "\n".join("  " + " -> ".join(c) for c in cycles)


def test_imports_go_down_the_layers():
    wrong = []
    for module, targets in sorted(_graph().items()):
        for t in sorted(targets):
            if _layer(t) > _layer(module):
                wrong.append(f"  {module} ({NAMES[_layer(module)]}) imports {t} ({NAMES[_layer(t)]})")
    assert not wrong, "imports from a higher layer:\n" + "\n".join(wrong)


@pytest.mark.parametrize("source, expected", [
    ("import opbridge.ops\n", {"opbridge.ops"}),
    ("from .ops import _torch_adapter\n", {"opbridge.ops._torch_adapter"}),
    ("from .ops import _torch_adapter, group_norm_x\n", {"opbridge.ops", "opbridge.ops._torch_adapter"}),
    ("from . import _core\n", {"opbridge._core"}),
    ("def f():\n    from ._optimize import x\n", {"opbridge._optimize"}),
    ("import importlib\nimportlib.import_module('.ops', __name__)\n", {"opbridge.ops"}),
])
def test_the_import_reader_sees_every_form(tmp_path, source, expected):
    # The checks above are only as good as what _imports finds: module-level, lazy and importlib.
    modules = _modules()
    f = tmp_path / "probe.py"
    f.write_text(source)
    assert _imports("opbridge._library", f, modules) == expected


def test_a_cycle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
