"""``opbridge new-op NAME``: scaffolds a project of your own ops on opbridge.

A new project (``--dir``, default ``./NAME``) gets a pyproject.toml (scikit-build-core; opbridge
pinned to this minor version, since its CMake package and C++ adapters are SameMinorVersion; torch
and ONNX Runtime only in extras, so that installing the package pulls in neither), a CMakeLists.txt with one ``opbridge_add_op`` line, the op's
declarations (forward and backward), CPU kernels of a real function (``y = alpha * x * weight``)
with their compute functions (opbridge's generic adapters run them in torch, ORT and _core), a
Python package and tests that pass as generated
(``pip install --no-build-isolation DIR && pytest DIR/tests``). In an existing project made by
this command, it adds the op's files and its ``opbridge_add_op`` line. ``--cuda`` adds a CUDA
kernel with its compute function.
"""

from __future__ import annotations

import importlib.resources
import keyword
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NewOp", "new_op"]

_OP_RE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DOMAIN_RE = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
_ADD_OP_RE = re.compile(r"^\s*opbridge_add_op\((?P<args>[^)]*)\)", re.M)

# The op's files: template -> path in the project ({op} is the op's name).
_OP_FILES = {
    "op.h.tmpl": "ops/{op}/{op}.h",
    "op_decl.cpp.tmpl": "ops/{op}/{op}_decl.cpp",
    "op_cpu.cpp.tmpl": "ops/{op}/{op}_cpu.cpp",
}
_CUDA_FILES = {
    "op_kernel.cu.tmpl": "ops/{op}/{op}_kernel.cu",
}
_PY_OP_FILES = {
    "op.py.tmpl": "python/{ns}/ops/{op}.py",
    "test_op.py.tmpl": "tests/test_{op}.py",
}
_PROJECT_FILES = {
    "pyproject.toml.tmpl": "pyproject.toml",
    "CMakeLists.txt.tmpl": "CMakeLists.txt",
    "README.md.tmpl": "README.md",
    "gitignore.tmpl": ".gitignore",
    "init.py.tmpl": "python/{ns}/__init__.py",
    "library.py.tmpl": "python/{ns}/_library.py",
    "ops_init.py.tmpl": "python/{ns}/ops/__init__.py",
}

_CUDA_BLOCK = """
option({NS}_WITH_CUDA "Also build the CUDA kernels (needs nvcc)" OFF)
if({NS}_WITH_CUDA)
  # opbridge_add_op compiles an op's CUDA files only where the project enables CUDA.
  enable_language(CUDA)
endif()
"""


@dataclass
class NewOp:
    """What ``new_op`` made: the project folder, the files it wrote, whether the project is new."""

    dir: Path
    files: list
    created_project: bool

    def __str__(self) -> str:
        lines = [f"{'created' if self.created_project else 'added to'} {self.dir}:"]
        lines += [f"  {p.relative_to(self.dir)}" for p in self.files]
        return "\n".join(lines)


def pascal(op: str) -> str:
    """rms_norm -> RmsNorm (the ONNX op type)."""
    return "".join(part[:1].upper() + part[1:] for part in op.split("_"))


def _pins() -> dict[str, str]:
    """Requirement strings for the opbridge and torch this opbridge was built with."""
    import opbridge

    major, minor = (int(p) for p in opbridge.__version__.split(".")[:2])
    pins = {"opbridge_req": f"opbridge>={major}.{minor},<{major}.{minor + 1}", "opbridge_minor": f"{major}.{minor}"}
    info = opbridge.build_info()
    # The torch extension is built on opbridge's torch adapter, on the LibTorch stable ABI of
    # torch_target: it builds with, and loads into, every torch from that release on.
    target = info.get("torch_target") or ""
    pins["torch_req"] = f"torch>={target}" if info.get("torch_version") and target else ""
    return pins


def _template(name: str) -> str:
    root = importlib.resources.files("opbridge") / "_templates" / "new_op"
    for sub in ("op", "project"):
        f = root / sub / name
        if f.is_file():
            return f.read_text()
    raise FileNotFoundError(f"opbridge new-op: template {name} is missing from the opbridge package")


def _render(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    leftover = re.findall(r"@[A-Za-z_]+@", text)
    if leftover:
        raise RuntimeError(f"opbridge new-op: unfilled template placeholders {sorted(set(leftover))}")
    return text


def _existing_project(root: Path) -> dict[str, str] | None:
    """LIBRARY, DOMAIN and NAMESPACE of a project made by new-op (from its first opbridge_add_op)."""
    cmake = root / "CMakeLists.txt"
    if not cmake.is_file():
        return None
    m = _ADD_OP_RE.search(cmake.read_text())
    if m is None:
        return None
    words = m.group("args").split()
    found = {k: words[i + 1] for i, k in enumerate(words[:-1]) if k in ("LIBRARY", "DOMAIN", "NAMESPACE")}
    if not {"LIBRARY", "DOMAIN", "NAMESPACE"} <= found.keys():
        return None
    return found


# --index-output: a second output, int64 indices (`peak`, per channel the first row of the largest
# y), which has no gradient: the declaration, the kernel and the tests of an op that returns indices.
_INDEX_KERNEL = """// peak[c] = the first row r with the largest y[r, c] (-1 where x has no rows); y: [rows, channels].
template <class T>
void peak(const T* y, int64_t* out, const @Op@Params& p) {
  const int64_t C = p.channels;
  for (int64_t c = 0; c < C; ++c) {
    out[c] = p.rows > 0 ? 0 : -1;
    for (int64_t r = 1; r < p.rows; ++r) {
      if (y[r * C + c] > y[out[c] * C + c]) out[c] = r;
    }
  }
}

"""
_INDEX_VALUES = {
    "index_types": '\n          .types("I", {ElemType::kInt64})  // one type, bound by no input: a fixed output type',
    "index_output": '\n          .output("peak", "I", "x[-1]", "per channel, the first row of the largest y (no gradient)")',
    "index_call": '\n    peak<T>(k.out<T>(0), k.out<int64_t>(1), p);',
    "return_type": "tuple[torch.Tensor, torch.Tensor]",
    "index_doc": "\n    Returns (y, peak): peak (C,) int64, per channel the first row of the largest y (no gradient).",
    "reference_return": ('    y = alpha * np.asarray(x, dtype=np.float64) * np.asarray(weight, dtype=np.float64)\n'
                         '    return y, y.reshape(-1, y.shape[-1]).argmax(0)  # peak: the first maximum'),
    "first": "[0]",
    "ort_outputs": "y_ort, peak_ort",
}
_PLAIN_VALUES = {
    "index_types": "", "index_output": "", "index_call": "", "index_kernel": "", "return_type": "torch.Tensor",
    "index_doc": "", "first": "", "ort_outputs": "(y_ort,)",
    "reference_return": "    return alpha * np.asarray(x, dtype=np.float64) * np.asarray(weight, dtype=np.float64)",
}


def new_op(name: str, dir: str | Path | None = None, namespace: str | None = None, domain: str | None = None,
           cuda: bool = False, index_output: bool = False) -> NewOp:
    """Scaffolds op ``name`` (snake_case) in a new project at ``dir`` (default ``./name``), or adds
    it to the project made by this function there. ``namespace``: torch namespace, C++ namespace
    and Python package (default: the folder's name); ``domain``: the ONNX domain of the project's
    ops (default ``com.example.<namespace>``); ``index_output``: the op also returns int64 indices
    (``peak``, without a gradient), CPU only. Raises ValueError for bad names or when a file would
    be overwritten."""
    if index_output and cuda:
        raise ValueError("--index-output makes a CPU op (its CUDA kernel would not fill the indices); leave out "
                         "--cuda, or add the CUDA kernel by hand")
    if not _OP_RE.match(name) or keyword.iskeyword(name):
        raise ValueError(f"op name must be snake_case (lowercase letters, digits, single underscores), got {name!r}")
    root = Path(dir) if dir is not None else Path(name)
    root = root.resolve()
    existing = _existing_project(root)

    if existing is not None:
        if namespace is not None and namespace != existing["NAMESPACE"]:
            raise ValueError(f"{root} is a project of namespace {existing['NAMESPACE']!r}, not {namespace!r}")
        if domain is not None and domain != existing["DOMAIN"]:
            raise ValueError(f"{root} is a project of domain {existing['DOMAIN']!r}, not {domain!r}")
        ns, dom, lib = existing["NAMESPACE"], existing["DOMAIN"], existing["LIBRARY"]
    else:
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise ValueError(f"--dir {root} exists and is not a project made by `opbridge new-op` (no "
                             "opbridge_add_op line with LIBRARY, DOMAIN and NAMESPACE in its CMakeLists.txt); "
                             "give a new or empty folder")
        ns = namespace if namespace is not None else re.sub(r"\W", "_", root.name).lower()
        dom = domain if domain is not None else f"com.example.{ns}"
        lib = ns
    if not _IDENT_RE.match(ns) or keyword.iskeyword(ns):
        raise ValueError(f"namespace must be a Python and C++ identifier (it names the torch namespace, the C++ "
                         f"namespace and the Python package), got {ns!r}; pass --namespace")
    if ns in ("opbridge", "torch", "aten", "onnx", "onnxruntime", "ops"):
        raise ValueError(f"namespace {ns!r} is taken; choose one of your own with --namespace")
    if not _DOMAIN_RE.match(dom):
        raise ValueError(f"domain may only hold letters, digits, '_', '-' and dots between them, got {dom!r}")
    if dom in ("ai.opbridge", "ai.onnx", "ai.onnx.ml", "com.microsoft", ""):
        raise ValueError(f"domain {dom!r} is not yours; pass --domain (e.g. com.yourcompany.{ns})")

    pins = _pins()
    values = {
        "op": name, "Op": pascal(name), "OP": name.upper(), "ns": ns, "NS": ns.upper(), "lib": lib, "domain": dom,
        "dist": ns.replace("_", "-"), "opbridge_req": pins["opbridge_req"], "opbridge_minor": pins["opbridge_minor"],
        "opbridge_spec": pins["opbridge_req"][len("opbridge"):],
        "torch_req": pins["torch_req"] or "torch",
        "torch_extra": (f'# The torch side (the ops\' Python functions, torch.ops.{ns}.*). The torch extension is on\n'
                        f'# the LibTorch stable ABI: one build for every torch from the release opbridge targets on.\n'
                        f'torch = ["{pins["torch_req"]}"]\n'
                        if pins["torch_req"] else ""),
        "torch_build_req": f', "{pins["torch_req"]}"' if pins["torch_req"] else "",
        "cuda_block": _CUDA_BLOCK.format(NS=ns.upper()) if cuda else "",
    }
    values.update(_INDEX_VALUES if index_output else _PLAIN_VALUES)
    if index_output:
        values["index_kernel"] = _INDEX_KERNEL.replace("@Op@", values["Op"])

    plan: dict[Path, str] = {}
    files = dict(_OP_FILES)
    if cuda:
        files.update(_CUDA_FILES)
    files.update(_PY_OP_FILES)
    if existing is None:
        files.update(_PROJECT_FILES)
    for template, target in files.items():
        plan[root / target.format(op=name, ns=ns)] = _render(_template(template), values)
    clashes = [p for p in plan if p.exists()]
    if clashes:
        raise ValueError(f"opbridge new-op: would overwrite {', '.join(str(p) for p in clashes)}")

    cmake_text = None
    if existing is not None:
        cmake = root / "CMakeLists.txt"
        text = cmake.read_text()
        if re.search(rf"^\s*opbridge_add_op\({re.escape(name)}[\s)]", text, re.M):
            raise ValueError(f"{cmake} already has opbridge_add_op({name} ...)")
        last = list(_ADD_OP_RE.finditer(text))[-1]
        cmake_text = text[: last.end()] + f"\nopbridge_add_op({name} LIBRARY {lib})" + text[last.end():]
        if cuda and f"{ns.upper()}_WITH_CUDA" not in text:
            anchor = "\nfind_package(opbridge"
            cmake_text = cmake_text.replace(anchor, values["cuda_block"] + anchor, 1)

    ops_init = root / _PROJECT_FILES["ops_init.py.tmpl"].format(ns=ns)
    ops_init_text = None
    if existing is not None and ops_init.is_file():
        # The op's function, statically visible to type checkers, beside the others (a project
        # made before this block existed gets none: its ops stay typed as load_package_ops makes them).
        text = ops_init.read_text()
        if "\nif TYPE_CHECKING:\n" in text:
            ops_init_text = text.rstrip("\n") + f"\n    from .{name} import {name} as {name}\n"

    for path, text in plan.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if cmake_text is not None:
        (root / "CMakeLists.txt").write_text(cmake_text)
    if ops_init_text is not None:
        ops_init.write_text(ops_init_text)
    return NewOp(root, sorted(plan), existing is None)
