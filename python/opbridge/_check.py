"""``opbridge check MODEL.onnx``: can this model run here, and with what?

Lists every (domain, op type) the model uses and who provides it (opbridge's library, stock ONNX
Runtime, a model-local function), then runs the model once on random inputs of its declared
shapes. Exit status: 0 all provided and the run succeeded; 1 something is missing, the model's
nodes do not fit their ops, or the model failed to load or run; 2 the file could not be read.
Needs onnx and onnxruntime, not torch.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, TextIO

import numpy as np

from ._library import DOMAIN
from ._ort import import_onnxruntime

log = logging.getLogger(__name__)  # stage timings at the command's -v

# Domains of the ONNX standard, whose ops onnx itself defines.
_STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")
# Standard ops ONNX Runtime handles at load without a kernel (a Constant becomes an initializer).
_NO_KERNEL_NEEDED = ("Constant",)
# The most elements of one random input (2**26: 512 MB while it is drawn in float64): a model file
# may declare any size, and the run is a check, not a workload.
MAX_RANDOM_ELEMENTS = 1 << 26
# Size given to symbolic/unknown input dimensions without a --dim value: 2 rather than 1, so that
# broadcasting across a batch is exercised.
DEFAULT_DIM = 2

_NP_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int16)": np.int16,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
}


@dataclass
class OpUse:
    domain: str
    op_type: str
    count: int = 0
    provider: str = ""  # who runs it; "" when nobody here does
    note: str = ""
    nodes: list[str] = field(default_factory=list)  # the names of its nodes

    def named(self) -> str:
        """The name, with the node names (the first three) in the messages about it."""
        shown = ", ".join(repr(n) for n in self.nodes[:3]) + (", ..." if len(self.nodes) > 3 else "")
        return f"{self.name} (node{'s' if len(self.nodes) > 1 else ''} {shown})" if self.nodes else self.name

    @property
    def name(self) -> str:
        return f"{self.domain or 'ai.onnx'}::{self.op_type}"


@dataclass
class Report:
    ops: list[OpUse] = field(default_factory=list)
    missing: list[OpUse] = field(default_factory=list)
    ran: bool = False
    error: str = ""
    # opbridge.libraries entry points of installed packages that were not registered (not fatal)
    skipped: list = field(default_factory=list)
    # of the run: {"name", "dtype", "shape"} per input; per output also "non_finite" (floats; else None)
    inputs: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing and self.ran and not self.error


def _declared_ops(stock: bool) -> dict[str, Any]:
    """domain -> OpLibrary for every custom-op library a run here registers (none with stock)."""
    from ._op_library import libraries

    return {} if stock else {lib.domain: lib for lib in libraries()}


def _ort_kernels(providers: Sequence[str]) -> set[tuple[str, str]]:
    import_onnxruntime()
    from onnxruntime.capi import _pybind_state as C

    wanted = set(providers)
    return {(("" if k.domain == "ai.onnx" else k.domain), k.op_name) for k in C.get_all_opkernel_def()
            if k.provider in wanted}


def classify(model: Any, providers: Sequence[str], stock: bool = False) -> list[OpUse]:
    """Every op the model uses, with who provides it (``stock``: as stock ONNX Runtime would run
    it, with no custom-op library)."""
    import onnx

    uses: dict[tuple[str, str], OpUse] = {}
    from .onnx._nodes import graph_nodes

    nodes = list(graph_nodes(model.graph))
    for fn in model.functions:
        nodes.extend(fn.node)
    for node in nodes:
        key = ("" if node.domain == "ai.onnx" else node.domain, node.op_type)
        use = uses.setdefault(key, OpUse(*key))
        use.count += 1
        if node.name:
            use.nodes.append(node.name)

    local = {(f.domain, f.name) for f in model.functions}
    kernels = _ort_kernels(providers)
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    libs = _declared_ops(stock)
    for (domain, op), use in uses.items():
        if (domain, op) in local:
            use.provider = "model-local function"
        elif domain in libs:
            lib = libs[domain]
            decl = lib.by_onnx_type(op)
            who = "opbridge" if domain == DOMAIN else f"library {os.path.basename(lib.path)}"
            refused = next((error for onnx_type, error in lib.refused.values() if onnx_type == op), None)
            if refused is not None:
                use.note = (f"misdeclared in {'this opbridge' if domain == DOMAIN else 'the ' + who}, which does "
                            f"not run it: {refused}")
            elif decl is None:
                names = ", ".join(sorted(d.onnx_type for d in lib.ops.values())) or "no ops"
                use.note = f"{'this opbridge' if domain == DOMAIN else 'the ' + who} provides {names} in {domain}"
            elif opsets.get(domain, 1) > lib.domain_version:
                use.note = (f"the model imports {domain} version {opsets[domain]}; the {who} implements up to "
                            f"version {lib.domain_version}: upgrade it")
            elif opsets.get(domain, 1) < decl.since:
                use.note = f"{op} exists since {domain} version {decl.since}; the model imports {opsets.get(domain, 1)}"
            else:
                use.provider = who
        elif domain == DOMAIN and stock:
            use.note = "an opbridge op: stock ONNX Runtime needs opbridge's library (or export with lowering='standard')"
        elif (domain, op) in kernels or (domain in _STANDARD_DOMAINS and op in _NO_KERNEL_NEEDED):
            use.provider = "stock onnxruntime"
        elif domain in _STANDARD_DOMAINS:
            version = opsets.get(domain, 1)
            try:
                known = onnx.defs.has(op, version, domain)
            except (TypeError, ValueError, OverflowError):  # a version onnx's bindings cannot take
                known = False
            if not known:
                use.note = f"not an op of {domain or 'ai.onnx'} opset {version}"
            else:
                schema = onnx.defs.get_schema(op, version, domain)
                if schema.has_function or schema.has_context_dependent_function:
                    use.provider = "stock onnxruntime"
                    use.note = "no dedicated kernel: runs expanded as its ONNX function (may be slow)"
                else:
                    use.note = "no kernel in this onnxruntime for the chosen providers"
        else:
            use.note = "custom domain: neither opbridge nor stock ONNX Runtime provides it"
    return sorted(uses.values(), key=lambda u: (u.domain, u.op_type))


def random_inputs(session: Any, dims: Mapping[str, int] | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """Random feeds for a session's inputs; symbolic dims from ``dims`` or DEFAULT_DIM."""
    rng = np.random.default_rng(seed)
    dims = dict(dims or {})
    feeds = {}
    for arg in session.get_inputs():
        shape = []
        for d in arg.shape:
            if isinstance(d, int) and d >= 0:
                shape.append(d)
            elif isinstance(d, str) and d in dims:
                shape.append(int(dims[d]))
            else:
                shape.append(DEFAULT_DIM)
        dtype = _NP_TYPES.get(arg.type)
        if dtype is None:
            raise ValueError(f"input {arg.name!r} has type {arg.type}, which opbridge check cannot generate")
        count = math.prod(shape)
        if count > MAX_RANDOM_ELEMENTS:
            raise ValueError(f"input {arg.name!r} of shape {shape} has {count} elements, more than the "
                             f"{MAX_RANDOM_ELEMENTS} a run on random inputs makes (the model declares these sizes; "
                             "--dim NAME=SIZE sets symbolic ones)")
        if np.issubdtype(dtype, np.floating):
            feeds[arg.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype is np.bool_:
            feeds[arg.name] = rng.random(shape) < 0.5
        else:
            # Small non-negative integers: valid as indices or sizes more often than not.
            feeds[arg.name] = rng.integers(0, 4, size=shape).astype(dtype)
    return feeds


def check(path: str | os.PathLike, *, providers: Sequence[str] | None = None, dims: Mapping[str, int] | None = None,
          run: bool = True, out: TextIO | None = None, libraries: Sequence[str] = (), discover: bool = True,
          stock: bool = False) -> Report:
    """Checks the model at ``path`` and prints a report to ``out`` (stdout).

    libraries: custom-op libraries of your own ops to register (built on opbridge).
    discover: also register the libraries installed packages announce (entry point group
        ``opbridge.libraries``); one that fails or is slow is reported and skipped
        (``opbridge._discovery.discover``).
    stock: how the model fares on stock ONNX Runtime: no custom-op library at all."""
    from .onnx import _reader  # needs onnx
    ort = import_onnxruntime()

    from ._version import __version__
    from ._discovery import _discover
    from ._op_library import register_library
    from ._session import session_options
    from .onnx._reader import INVALID_MODEL

    skipped = []
    if not stock:
        for lib in libraries:
            register_library(lib)
        if discover:
            skipped = _discover()[1]

    out = out or sys.stdout
    providers = list(providers or ["CPUExecutionProvider"])
    # The graph, and every tensor checked (external data inside the model's folder, offsets and
    # lengths within its files) before ONNX Runtime reads any: UnreadableModel otherwise.
    model = _reader.read_graph(path)
    _reader.check(model, path)
    start = time.perf_counter()
    report = Report(ops=classify(model, providers, stock=stock), skipped=skipped)
    log.info("ops and who provides them: %.3f s", time.perf_counter() - start)
    report.missing = [u for u in report.ops if not u.provider]
    problems = [] if stock else _model_problems(model)

    opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)
    print(f"model        {os.fspath(path)}", file=out)
    print(f"             IR version {model.ir_version}; opsets: {opsets}", file=out)
    print(f"runtime      onnxruntime {ort.__version__} ({', '.join(providers)}); opbridge {__version__}"
          + ("; stock: no custom-op library" if stock else ""), file=out)
    for s in skipped:
        print(f"skipped      the op library of {s}", file=out)
    print("\nops used:", file=out)
    width = max((len(u.name) for u in report.ops), default=10)
    for u in report.ops:
        who = u.provider or "MISSING"
        note = f"  ({u.note})" if u.note else ""
        print(f"  {u.name:{width}s} x{u.count:<4d} {who}{note}", file=out)

    if report.missing:
        names = ", ".join(u.named() for u in report.missing)
        print(f"\nFAILED: no implementation here for {names}.", file=out)
        domains = sorted({u.domain for u in report.missing if u.domain not in (DOMAIN, *_STANDARD_DOMAINS)
                          and not u.note.startswith("misdeclared")})
        if any(u.note.startswith("misdeclared") for u in report.missing):
            print("  Fix the declaration of a misdeclared op and rebuild its library.", file=out)
        if domains:
            print(f"  Register the custom-op library that implements domain(s) {', '.join(domains)} "
                  "(SessionOptions.register_custom_ops_library) before running this model.", file=out)
            if skipped:
                print(f"  Skipped above: the op libraries of {', '.join(sorted({x.package for x in skipped}))}; "
                      "one of them may provide it.", file=out)
        if not stock and any(u.domain == DOMAIN for u in report.missing):
            print("  The model needs a newer opbridge, or was exported by a different one.", file=out)
        print("  The model was not run.", file=out)
        return report
    if problems:
        report.error = f"{INVALID_MODEL} " + "; ".join(problems)
        print(f"\nFAILED: {INVALID_MODEL}", file=out)
        for p in problems:
            print(f"  {p}", file=out)
        print("  The model was not run.", file=out)
        return report
    if not run:
        report.ran = True
        print("\nOK: every op is provided (not run).", file=out)
        return report

    start = time.perf_counter()
    so = ort.SessionOptions()
    if not log.isEnabledFor(logging.INFO):
        # A failure is reported below in full; ONNX Runtime's own log line would repeat it (at -v it stays).
        so.log_severity_level = 4
    try:
        # The model's nodes were checked above (what opbridge.InferenceSession checks first).
        session = ort.InferenceSession(os.fspath(path), sess_options=so if stock else session_options(so),
                                       providers=providers)
    except Exception as e:  # ORT raises its own exception types
        report.error = f"onnxruntime {ort.__version__} could not load the model: {_ort_message(e)}"
        print(f"\nFAILED: {report.error}", file=out)
        return report
    log.info("onnxruntime session: %.3f s", time.perf_counter() - start)
    start = time.perf_counter()
    try:
        feeds = random_inputs(session, dims)
        outputs = session.run(None, feeds)
        log.info("run: %.3f s", time.perf_counter() - start)
    except Exception as e:
        report.error = f"running the model failed: {_ort_message(e)}"
        guessed = _guessed_dims(session, dims)
        if guessed:
            report.error += (f" (on random inputs whose dimensions {', '.join(guessed)} were not given by --dim "
                             f"and were set to {DEFAULT_DIM}: give their sizes with --dim NAME=SIZE)")
        print(f"\nFAILED: {report.error}", file=out)
        return report
    report.ran = True
    print("\nran once on random inputs:", file=out)
    for arg, value in feeds.items():
        print(f"  input  {arg}: {value.dtype} {list(value.shape)}", file=out)
        report.inputs.append({"name": arg, "dtype": str(value.dtype), "shape": list(value.shape)})
    for meta, value in zip(session.get_outputs(), outputs):
        value = np.asarray(value)
        finite, bad = "", None
        if np.issubdtype(value.dtype, np.floating):
            bad = int(value.size - np.count_nonzero(np.isfinite(value)))
            finite = f", {bad} non-finite" if bad else ", all finite"
        report.outputs.append({"name": meta.name, "dtype": str(value.dtype), "shape": list(value.shape),
                               "non_finite": bad})
        print(f"  output {meta.name}: {value.dtype} {list(value.shape)}{finite}", file=out)
    print("\nOK", file=out)
    return report


def _model_problems(model: Any) -> list[str]:
    from .onnx._declared_export import model_problems

    return model_problems(model)


def _ort_message(e: Exception) -> str:
    """ONNX Runtime's message without its wrapping: a kernel's error comes as "[ONNXRuntimeError] :
    2 : INVALID_ARGUMENT : Non-zero status code returned while running GroupNorm node. Name:'gn'
    Status Message: <the kernel's message>"; ours names the op and the node itself, another
    kernel's gets them in front."""
    text = str(e)
    m = re.search(r"running (\S+) node\. Name:'(.*?)' Status Message: (.*)", text, re.S)
    if m is None:
        return text
    op_type, name, message = m.group(1), m.group(2), m.group(3).strip()
    return message if f"(node {name!r})" in message else f"{op_type} (node {name!r}): {message}"


def _guessed_dims(session: Any, dims: Mapping[str, int] | None) -> list[str]:
    """The symbolic or unknown input dimensions a run gave DEFAULT_DIM (not given by --dim), as
    'NAME (input X)' or 'X[axis]'."""
    guessed: dict[str, None] = {}  # in order, once each
    for arg in session.get_inputs():
        for axis, d in enumerate(arg.shape):
            if isinstance(d, str) and d not in (dims or {}):
                guessed.setdefault(f"{d!r} (input {arg.name!r})")
            elif not isinstance(d, (int, str)) or (isinstance(d, int) and d < 0):
                guessed.setdefault(f"{arg.name}[{axis}]")
    return list(guessed)
