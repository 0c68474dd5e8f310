"""AOTInductor packages (``.pt2``) that call opbridge's ops or your own.

A package compiled with ``torch._inductor.aoti_compile_and_package`` calls custom ops by name
through torch's dispatcher (the proxy executor); it does not contain them. Whoever loads the
package must first load the op libraries: ``import opbridge.ops`` (and your op packages) in
Python, ``opbridge::load_torch_ops()`` in C++ (``<opbridge/torch/load_ops.h>``, docs/deploy.md).

:func:`inspect_package` says which ops a package calls, which library provides each, and whether
those libraries load into this torch (checked in a child process, so nothing is loaded here).
``opbridge pt2 MODEL.pt2`` prints the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field

__all__ = ["PackageOps", "package_ops", "inspect_package"]


@dataclass
class PackageOps:
    """What :func:`inspect_package` found in one package.

    ops: the qualified names (``namespace::op``) the package calls through torch's dispatcher,
        other than ATen's own, in first-use order.
    libraries: for each namespace among them, the torch op library that provides it (a path), or
        None where no opbridge or registered library has that namespace.
    loads: whether loading those libraries into a fresh process of this Python registers every op
        (None where it was not checked).
    problems: what is missing or failed, one sentence each (empty when the package can run).
    """

    path: str
    ops: list[str] = field(default_factory=list)
    libraries: dict[str, str | None] = field(default_factory=dict)
    loads: bool | None = None
    problems: list[str] = field(default_factory=list)

    def library_paths(self) -> list[str]:
        """The libraries to load before the package, opbridge's first, each once."""
        seen: list[str] = []
        for ns, p in sorted(self.libraries.items(), key=lambda kv: kv[0] != "opbridge"):
            if p is not None and p not in seen:
                seen.append(p)
        return seen

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "ops": self.ops, "libraries": self.libraries, "loads": self.loads,
                "problems": self.problems}


def package_ops(path: str | os.PathLike[str]) -> list[str]:
    """The custom ops (``namespace::op``) an AOTInductor package calls by name, read from the
    extern-kernel lists the package keeps beside each compiled model; no torch needed.
    Raises ValueError naming the file where it is not an AOTInductor package."""
    path = os.fspath(path)
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise ValueError(f"{path}: not an AOTInductor package (a .pt2 zip archive): {e}") from None
    ops: list[str] = []
    found_model = False
    with zf:
        for name in zf.namelist():
            parts = name.split("/")
            if "aotinductor" not in parts:
                continue
            found_model = True
            if not name.endswith(".json") or name.endswith("_metadata.json"):
                continue
            try:
                doc = json.loads(zf.read(name))
            except (ValueError, UnicodeDecodeError) as e:
                raise ValueError(f"{path}: {name} is not valid JSON: {e}") from None
            for node in doc.get("nodes", []) if isinstance(doc, dict) else []:
                target = (node.get("node") or {}).get("target") if isinstance(node, dict) else None
                if isinstance(target, str) and "::" in target and not target.startswith("aten::"):
                    op = target.split(".", 1)[0]  # "ns::op.overload" -> "ns::op"
                    if op not in ops:
                        ops.append(op)
    if not found_model:
        raise ValueError(f"{path}: not an AOTInductor package (no data/aotinductor/ folder inside)")
    return ops


def _namespace_libraries() -> dict[str, str | None]:
    """namespace -> torch op library: opbridge's own and those of registered / installed op
    packages (``opbridge.libraries`` entry points)."""
    from ._discovery import discover
    from ._op_library import libraries
    from ._library import torch_library_path

    found: dict[str, str | None] = {"opbridge": torch_library_path()}
    try:
        discover()
    except Exception:  # noqa: BLE001  (a broken entry point is reported by discover's warnings)
        pass
    for lib in libraries()[1:]:
        if lib.namespace and lib.namespace not in found:
            found[lib.namespace] = lib.torch_path
    return found


_LOAD_CHECK = r"""
import json, sys, torch
paths, ops = json.loads(sys.argv[1]), json.loads(sys.argv[2])
errors = []
for p in paths:
    try:
        torch.ops.load_library(p)
    except Exception as e:
        errors.append(f"{p} does not load into torch {torch.__version__}: {e}")
for op in ops:
    ns, name = op.split("::", 1)
    if not hasattr(getattr(torch.ops, ns), name):
        errors.append(f"{op} is not registered after loading {', '.join(paths) or 'nothing'}")
print(json.dumps(errors))
"""


def inspect_package(path: str | os.PathLike[str], check_load: bool = True, timeout: float = 120.0) -> PackageOps:
    """The ops a package calls, the library of each, and (check_load) whether those libraries
    load and register every op in a fresh process of this Python (this process loads nothing).
    Raises ValueError naming the file where it is not an AOTInductor package."""
    report = PackageOps(path=os.fspath(path), ops=package_ops(path))
    known = _namespace_libraries()
    for op in report.ops:
        ns = op.split("::", 1)[0]
        if ns in report.libraries:
            continue
        lib = report.libraries[ns] = known.get(ns)
        if lib is None:
            why = ("opbridge was built without its torch extension" if ns == "opbridge" else
                   "no installed or registered opbridge op library has this torch namespace: load its "
                   "library yourself before the package")
            report.problems.append(f"{ns}: {why} (ops {', '.join(o for o in report.ops if o.startswith(ns + '::'))})")
    if check_load and report.ops:
        paths = report.library_paths()
        ops = [o for o in report.ops if report.libraries.get(o.split("::", 1)[0]) is not None]
        try:
            out = subprocess.run([sys.executable, "-c", _LOAD_CHECK, json.dumps(paths), json.dumps(ops)],
                                 capture_output=True, text=True, timeout=timeout)
            errors = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() \
                else [f"the load check ended with status {out.returncode}: {out.stderr.strip()[-500:]}"]
        except subprocess.TimeoutExpired:
            errors = [f"the load check took over {timeout:.0f} s"]
        report.problems.extend(errors)
        report.loads = not errors
    elif check_load:
        report.loads = True
    return report


def format_report(r: PackageOps) -> str:
    """The report as ``opbridge pt2`` prints it."""
    lines = [f"{r.path}: {len(r.ops)} custom op{'s' if len(r.ops) != 1 else ''} called by name"]
    for op in r.ops:
        lib = r.libraries.get(op.split("::", 1)[0])
        lines.append(f"  {op:40s} {lib if lib is not None else '(no known library)'}")
    if r.loads is not None and r.ops:
        lines.append("libraries load and register every op: " + ("yes" if r.loads else "NO"))
    for p in r.problems:
        lines.append(f"  problem: {p}")
    if r.ops:
        lines.append("load them before the package: Python `import opbridge.ops` (and your op packages); C++ "
                     "opbridge::load_torch_ops(" + ", ".join(f'"{p}"' for p in r.library_paths()[1:]) + ")")
    return "\n".join(lines)

