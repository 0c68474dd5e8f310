"""``opbridge.testing.check_op``: what a test suite calls to check a declared op end to end.

One call runs, for every sample and dtype:

* the op against a float64 reference function you write (independently of the kernel);
* ``torch.library.opcheck`` (schema, fake kernel, autograd registration, AOT dispatch);
* ``torch.autograd.gradcheck`` where the op is differentiable, ``gradgradcheck`` where it is
  differentiable twice, and otherwise that second-order gradients are a clear error;
* export with both exporters (dynamo, TorchScript) in each lowering the op has ("custom", plus
  "standard" where one is registered), the ONNX checker, and ONNX Runtime (CPU, and CUDA where this
  onnxruntime has it) against torch;
* the op on a CUDA device against the reference where torch has one.

Failures are collected and reported together, one line each with the numbers that matter, in an
:class:`OpCheckError` (an AssertionError, so pytest shows the report)::

    import opbridge.testing
    opbridge.testing.check_op("myops::rms_norm", reference, samples=[(x, weight, 1e-6), (x2, weight2)])
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence, Union, cast

import numpy as np
import torch

from ._ort import import_onnxruntime

if TYPE_CHECKING:
    from ._declarations import MisdeclaredOpError, OpDecl

    # What check_op takes as the op: "namespace::name", a torch op, or its declaration.
    OpLike = Union[str, torch._ops.OpOverload, torch._ops.OpOverloadPacket, OpDecl]
    _Samples = list[Sequence[Any]]
    _Tolerances = Mapping[torch.dtype, tuple[float, float]]

__all__ = ["CheckReport", "OpCheckError", "check_op", "default_tolerances"]

_ELEM_DTYPES = {1: torch.float32, 11: torch.float64, 10: torch.float16, 16: torch.bfloat16}
_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
                torch.bfloat16: "bfloat16"}
_NP = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}


def default_tolerances() -> dict[torch.dtype, tuple[float, float]]:
    """(rtol, atol) per dtype for comparisons with the float64 reference and between torch and
    ONNX Runtime: a few units in the last place of each type, scaled for reductions."""
    return {torch.float64: (1e-9, 1e-9), torch.float32: (1e-4, 1e-5), torch.float16: (1e-2, 1e-3),
            torch.bfloat16: (2e-2, 1e-2)}


class OpCheckError(AssertionError):
    """check_op found problems; the message is the whole report."""


@dataclass
class Check:
    name: str
    status: str  # "ok", "FAIL", "skip"
    detail: str = ""


@dataclass
class CheckReport:
    """Every check check_op ran, in order."""

    op: str
    checks: list[Check] = field(default_factory=list)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == "FAIL"]

    def add(self, name: str, status: str, detail: str = "") -> None:
        self.checks.append(Check(name, status, detail))

    def __str__(self) -> str:
        n = {s: sum(c.status == s for c in self.checks) for s in ("ok", "FAIL", "skip")}
        lines = [f"check_op({self.op}): {n['FAIL']} failed, {n['ok']} passed, {n['skip']} skipped"]
        # Failures first: they are what the reader needs.
        for c in sorted(self.checks, key=lambda c: {"FAIL": 0, "skip": 1, "ok": 2}[c.status]):
            text = f"  {c.status:4s}  {c.name}"
            if c.detail:
                text += ": " + c.detail.replace("\n", "\n          ")
            lines.append(text)
        return "\n".join(lines)


# ---------------------------------------------------------------- helpers


def _resolve(op: OpLike) -> tuple[Any, Any]:
    """(OpDecl, torch OpOverload) of ``op``: "namespace::name", a torch op, or an OpDecl."""
    from ._declarations import OpDecl
    from ._op_library import libraries

    if isinstance(op, OpDecl):
        qualname = op.qualname
    elif isinstance(op, str):
        qualname = op
    elif isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        qualname = op._qualified_op_name if hasattr(op, "_qualified_op_name") else op.name()
        qualname = qualname.split(".")[0]
    else:
        raise TypeError(f"op must be 'namespace::name', a torch op or an OpDecl, got {type(op).__name__}")
    if "::" not in qualname:
        raise ValueError(f"op must be 'namespace::name' (e.g. 'opbridge::group_norm'), got {qualname!r}")
    ns, name = qualname.split("::", 1)

    def find() -> Any:
        return next((lib.ops[name] for lib in libraries() if lib.namespace == ns and name in lib.ops), None)

    decl = find()
    if decl is None:  # perhaps a library an installed package announces
        from ._discovery import discover

        discover()
        decl = find()
    if decl is None:
        refused = next((lib for lib in libraries() if lib.namespace == ns and name in lib.refused), None)
        if refused is not None:
            raise cast("MisdeclaredOpError", refused.misdeclared([name]))
        known = sorted(o.qualname for lib in libraries() if lib.namespace for o in lib.ops.values())
        raise ValueError(f"{qualname} is not a declared op of any library opbridge knows ({', '.join(known)}); "
                         "register its library first (opbridge.register_library, or import the package "
                         "that provides it)")
    try:
        overload = getattr(getattr(torch.ops, ns), name).default
    except (AttributeError, RuntimeError) as e:
        raise ValueError(f"{qualname}: no torch op of that name; import the module that loads the library's torch "
                         "extension and registers its autograd (for a package made by `opbridge new-op`: "
                         "<package>.ops)") from e
    return decl, overload


def _cast(args: Sequence[Any], dtype: torch.dtype, device: str = "cpu") -> tuple[Any, ...]:
    """Floating tensors to `dtype` and every tensor to `device`; other arguments as they are."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            a = a.detach().to(device)
            if a.is_floating_point():
                a = a.to(dtype)
            out.append(a.clone())
        else:
            out.append(a)
    return tuple(out)


def _as_tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _to_numpy(value: Any) -> np.ndarray[Any, Any]:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return cast("np.ndarray[Any, Any]",
                    value.to(torch.float64).numpy() if value.is_floating_point() else value.numpy())
    return np.asarray(value)


def _compare(got: Any, expected: Any, rtol: float, atol: float) -> str:
    """"" when got matches expected (NaN where expected has NaN), else what differs. Integer and
    bool outputs are compared exactly; floating ones within rtol and atol."""
    g = _to_numpy(got).astype(np.float64) if np.issubdtype(_to_numpy(got).dtype, np.floating) else _to_numpy(got)
    e = np.asarray(_to_numpy(expected))
    if g.shape != e.shape:
        return f"shape {tuple(g.shape)}, expected {tuple(e.shape)}"
    if g.size == 0:
        return ""
    if g.dtype.kind in "biu":
        # Indices, counts and masks: equal or wrong, whatever their size (a float tolerance would
        # let an index that is off by one pass once it exceeds 1 / rtol).
        same = g == e
        if same.all():
            return ""
        idx = tuple(int(i) for i in np.argwhere(~same)[0])
        return (f"{int((~same).sum())} of {same.size} elements differ ({g.dtype} output, compared exactly); first at "
                f"index {idx}: got {g[idx].item()!r}, expected {e[idx].item()!r}")
    e = e.astype(np.float64)
    nan_g, nan_e = np.isnan(g), np.isnan(e)
    if (nan_g != nan_e).any():
        idx = tuple(int(i) for i in np.argwhere(nan_g != nan_e)[0])
        return f"NaN where the other has none at index {idx} (got {g[idx]!r}, expected {e[idx]!r})"
    ok = np.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
    if ok.all():
        return ""
    err = np.where(ok, 0.0, np.abs(g - e))
    idx = tuple(int(i) for i in np.unravel_index(np.nanargmax(err), err.shape))
    return (f"{int((~ok).sum())} of {ok.size} elements differ; worst at index {idx}: got {g[idx]:.8g}, "
            f"expected {e[idx]:.8g} (|diff| {abs(g[idx] - e[idx]):.3g} > atol {atol:g} + rtol {rtol:g} * |expected|)")


def _compare_all(got: Any, expected: Any, rtol: float, atol: float) -> str:
    g, e = _as_tuple(got), _as_tuple(expected)
    if len(g) != len(e):
        return f"{len(g)} outputs, the reference gave {len(e)}"
    problems = []
    for k, (a, b) in enumerate(zip(g, e)):
        p = _compare(a, b, rtol, atol)
        if p:
            problems.append(p if len(g) == 1 else f"output {k}: {p}")
    return "; ".join(problems)


def _error(e: BaseException, lines: int = 6) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    parts = text.splitlines()
    return "\n".join(parts[:lines]) + (" ..." if len(parts) > lines else "")


def _differentiable_args(args: Sequence[Any]) -> list[int]:
    """Positions of floating tensor arguments (the ones gradients are taken for)."""
    return [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point()]


class _OpModule(torch.nn.Module):
    """The op as a model whose inputs are the sample's tensors (attributes are constants)."""

    def __init__(self, overload: Any, args: Sequence[Any]) -> None:
        super().__init__()
        self.overload = overload
        self.positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        self.template = [None if i in self.positions else a for i, a in enumerate(args)]

    def forward(self, *tensors: torch.Tensor) -> Any:
        args = list(self.template)
        for i, t in zip(self.positions, tensors):
            args[i] = t
        return self.overload(*args)


# ---------------------------------------------------------------- the checks


def check_op(
    op: OpLike,
    reference: Callable[..., Any],
    samples: Iterable[Sequence[Any]],
    *,
    dtypes: Sequence[torch.dtype] | None = None,
    tolerances: Mapping[torch.dtype, tuple[float, float]] | None = None,
    opcheck: bool = True,
    gradcheck: bool = True,
    export: bool = True,
    exporters: Sequence[str] = ("dynamo", "torchscript"),
    lowerings: Sequence[str] | None = None,
    export_samples: int = 1,
    cuda: bool = True,
    core: bool = True,
    raise_on_failure: bool = True,
) -> CheckReport:
    """Checks a declared op (ours or yours) end to end; raises OpCheckError with the report when
    anything fails, else returns the report.

    op: ``"namespace::name"`` (e.g. ``"opbridge::group_norm"``, ``"myops::rms_norm"``), the torch op,
        or its OpDecl. Its library must be known to opbridge (``register_library``; packages made
        by ``opbridge new-op`` register theirs on import of their ``ops``).
    reference: the float64 reference, called with each sample's arguments (floating tensors as
        float64 CPU tensors, other arguments as given); returns a tensor or numpy array, or a
        tuple of them for several outputs. Write it independently of the kernel.
    samples: argument tuples in the op's argument order (trailing arguments with defaults may be
        left out). Floating tensors are cast to each dtype; use fresh random values, not zeros.
    dtypes: the floating dtypes to run (default: those the declaration allows).
    tolerances: (rtol, atol) per dtype, overriding :func:`default_tolerances`; used against the
        reference and between ONNX Runtime and torch.
    opcheck / gradcheck / export / cuda / core: turn a group of checks off (core: the op's CPU
        kernel on arrays, through its library as opbridge._core runs it: OpDecl.run).
    exporters: "dynamo" and/or "torchscript".
    lowerings: default "custom", plus "standard" where the op has a standard lowering.
    export_samples: how many samples (the first ones) to export per dtype, exporter and lowering.
    raise_on_failure: False returns the report even when checks failed.
    """
    decl, overload = _resolve(op)
    report = CheckReport(decl.qualname)
    samples = [tuple(s) for s in samples]
    if not samples:
        raise ValueError("check_op: give at least one sample (a tuple of the op's arguments)")
    tol = default_tolerances()
    tol.update(dict(tolerances or {}))
    allowed = sorted({_ELEM_DTYPES[t] for types in decl.types.values() for t in types if t in _ELEM_DTYPES},
                     key=lambda d: list(_DTYPE_NAMES).index(d))
    dtypes = list(dtypes) if dtypes is not None else allowed
    for dt in dtypes:
        if dt not in allowed:
            report.add(f"dtype {_DTYPE_NAMES.get(dt, dt)}", "FAIL",
                       f"the declaration of {decl.qualname} allows {[_DTYPE_NAMES[d] for d in allowed]}")
    dtypes = [d for d in dtypes if d in allowed]

    _check_forward(report, overload, reference, samples, dtypes, tol, "cpu")
    if cuda and torch.cuda.is_available():
        _check_forward(report, overload, reference, samples, dtypes, tol, "cuda")
    elif cuda:
        report.add("forward on CUDA", "skip", "no CUDA device (torch.cuda.is_available() is False)")
    if core:
        _check_core(report, decl, reference, samples, dtypes, tol)
    if opcheck:
        _check_opcheck(report, decl, overload, samples, dtypes)
    if gradcheck:
        _check_gradients(report, decl, overload, samples)
    if export:
        _check_export(report, decl, overload, samples, dtypes, tol, exporters, lowerings, export_samples)
    if report.failures and raise_on_failure:
        raise OpCheckError(str(report))
    return report


def _check_forward(report: CheckReport, overload: Any, reference: Callable[..., Any], samples: _Samples,
                   dtypes: list[torch.dtype], tol: _Tolerances, device: str) -> None:
    where = "" if device == "cpu" else f" on {device}"
    for k, sample in enumerate(samples):
        try:
            expected = reference(*_cast(sample, torch.float64))
        except Exception as e:  # the reference itself failing is the user's to see
            report.add(f"reference, sample {k}", "FAIL", _error(e))
            continue
        for dt in dtypes:
            name = f"forward {_DTYPE_NAMES[dt]}{where}, sample {k}"
            try:
                got = overload(*_cast(sample, dt, device))
            except NotImplementedError as e:
                if device != "cpu":
                    report.add(name, "skip", f"no {device} kernel: {_error(e, 1)}")
                    return
                report.add(name, "FAIL", _error(e))
                continue
            except Exception as e:
                report.add(name, "FAIL", _error(e))
                continue
            bad = [f"output {i} has dtype {o.dtype}, expected {dt}" for i, o in enumerate(_as_tuple(got))
                   if isinstance(o, torch.Tensor) and o.is_floating_point() and o.dtype != dt]
            problem = "; ".join(bad) or _compare_all(got, expected, *tol[dt])
            report.add(name, "FAIL" if problem else "ok", problem)


def _check_core(report: CheckReport, decl: Any, reference: Callable[..., Any], samples: _Samples,
                dtypes: list[torch.dtype], tol: _Tolerances) -> None:
    """The op's CPU kernel on arrays through its library (OpDecl.run, what opbridge._core.<op>
    runs): no torch in the call, the declaration's checks and output rules applied by the library."""
    try:
        decl.library.run_entry()
    except NotImplementedError as e:
        report.add("arrays (opbridge._core)", "skip", _error(e, 1))
        return
    for k, sample in enumerate(samples):
        try:
            expected = reference(*_cast(sample, torch.float64))
        except Exception:
            continue  # reported by the forward check
        for dt in dtypes:
            name = f"arrays (opbridge._core) {_DTYPE_NAMES[dt]}, sample {k}"
            try:
                # Tensors go in through DLPack (bfloat16 included); results are numpy arrays.
                got = decl.run(*_cast(sample, dt))
            except Exception as e:
                if isinstance(e, RuntimeError) and "has no CPU kernel" in str(e):
                    # An op with compute functions for CUDA only has nothing to run on arrays.
                    report.add("arrays (opbridge._core)", "skip", _error(e, 1))
                    return
                report.add(name, "FAIL", _error(e))
                continue
            got = tuple(np.asarray(o).astype(np.float64) if np.asarray(o).dtype.kind in "fV" or
                        str(np.asarray(o).dtype) == "bfloat16" else np.asarray(o) for o in _as_tuple(got))
            problem = _compare_all(got, expected, *tol[dt])
            report.add(name, "FAIL" if problem else "ok", problem)


def _requires_grad(args: Sequence[Any], positions: Sequence[int]) -> tuple[Any, ...]:
    out = list(args)
    for i in positions:
        out[i] = out[i].detach().clone().requires_grad_(True)
    return tuple(out)


def _check_opcheck(report: CheckReport, decl: Any, overload: Any, samples: _Samples, dtypes: list[torch.dtype]) -> None:
    from .ops._torch_adapter import gradient_order

    order = gradient_order(decl.qualname) or 0
    for k, sample in enumerate(samples):
        dt = torch.float32 if torch.float32 in dtypes else dtypes[0]
        args = _cast(sample, dt)
        if order >= 1:
            args = _requires_grad(args, _differentiable_args(args))
        name = f"torch.library.opcheck {_DTYPE_NAMES[dt]}, sample {k}"
        try:
            torch.library.opcheck(overload, args)
            report.add(name, "ok")
        except Exception as e:
            report.add(name, "FAIL", _error(e, 10))


def _check_gradients(report: CheckReport, decl: Any, overload: Any, samples: _Samples) -> None:
    from .ops._torch_adapter import differentiable_form, gradient_order

    order = gradient_order(decl.qualname)
    if not order:
        report.add("gradcheck", "skip", f"{decl.qualname} has no gradient formula")
        return
    form = differentiable_form(decl.qualname)
    for k, sample in enumerate(samples):
        args = _cast(sample, torch.float64)
        positions = _differentiable_args(args)
        if not positions:
            report.add(f"gradcheck, sample {k}", "skip", "no floating tensor argument")
            continue

        def fn(*tensors: torch.Tensor, args: Sequence[Any] = args, positions: list[int] = positions) -> Any:
            full = list(args)
            for i, t in zip(positions, tensors):
                full[i] = t
            return overload(*full)

        inputs = tuple(args[i].detach().clone().requires_grad_(True) for i in positions)
        # Fast mode (random projections of the Jacobian) for bigger samples: the full numerical
        # Jacobian costs one forward per input element.
        fast = sum(t.numel() for t in inputs) > 512
        try:
            torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-4, fast_mode=fast)
            report.add(f"gradcheck, sample {k}", "ok")
        except Exception as e:
            report.add(f"gradcheck, sample {k}", "FAIL", _error(e, 12))
            continue
        if form is not None:
            # The torch-ops form that higher-order gradients differentiate must be the op.
            problem = _compare_all(form(*args), overload(*args), 1e-9, 1e-9)
            report.add(f"differentiable form matches the op, sample {k}", "FAIL" if problem else "ok", problem)
        if order >= 2:
            try:
                torch.autograd.gradgradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-4, fast_mode=fast)
                report.add(f"gradgradcheck, sample {k}", "ok")
            except Exception as e:
                report.add(f"gradgradcheck, sample {k}", "FAIL", _error(e, 12))
        else:
            name = f"second-order gradients are a clear error, sample {k}"
            try:
                outs = [o for o in _as_tuple(fn(*inputs)) if isinstance(o, torch.Tensor) and o.requires_grad]
                grads = torch.autograd.grad([o.sum() for o in outs], inputs, create_graph=True, allow_unused=True)
                total = sum(g.sum() for g in grads if g is not None and g.requires_grad)
                if isinstance(total, torch.Tensor):
                    total.backward()
                report.add(name, "FAIL", "differentiating the gradients succeeded although the op declares first-order "
                           "gradients only: they would be silently wrong (pass double_backward=True or a "
                           "differentiable form to register_autograd if they are right)")
            except NotImplementedError:
                report.add(name, "ok")
            except Exception as e:
                report.add(name, "FAIL", f"expected NotImplementedError, got {_error(e, 3)}")


def _lowerings(decl: Any, requested: Sequence[str] | None) -> list[str]:
    from .onnx._registry import _modules, _standard

    _modules()  # opbridge's own standard lowerings register when their modules are imported
    has_standard = decl.qualname in _standard
    if requested is None:
        return ["custom", "standard"] if has_standard else ["custom"]
    return list(requested)


def _custom_domains() -> set[str]:
    from ._op_library import libraries

    return {lib.domain for lib in libraries()}


def _check_export(report: CheckReport, decl: Any, overload: Any, samples: _Samples, dtypes: list[torch.dtype],
                  tol: _Tolerances, exporters: Sequence[str], lowerings: Sequence[str] | None,
                  export_samples: int) -> None:
    try:
        import onnx

        import opbridge.onnx

        ort = import_onnxruntime()
    except ImportError as e:
        report.add("export", "skip", f"needs onnx, onnxscript and onnxruntime: {e}")
        return
    from ._session import InferenceSession

    providers = ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        providers.append("CUDAExecutionProvider")
    for lowering in _lowerings(decl, lowerings):
        for exporter in exporters:
            if exporter not in ("dynamo", "torchscript"):
                raise ValueError(f"exporters: expected 'dynamo' and/or 'torchscript', got {exporter!r}")
            for dt in dtypes:
                for k, sample in enumerate(samples[:export_samples]):
                    label = f"{exporter} export, lowering {lowering}, {_DTYPE_NAMES[dt]}, sample {k}"
                    args = _cast(sample, dt)
                    model = _OpModule(overload, args).eval()
                    tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
                    try:
                        # Static shapes: a sample's tensors need not share a batch dimension.
                        proto = opbridge.onnx.export(model, tensors, dynamo=exporter == "dynamo",
                                                     lowering={decl.qualname: lowering}, dynamic_batch=False)
                    except Exception as e:
                        report.add(label, "FAIL", _error(e, 8))
                        continue
                    problem = _graph_problem(proto, decl, lowering)
                    if not problem:
                        try:
                            onnx.checker.check_model(proto, full_check=True)
                        except Exception as e:
                            problem = f"onnx.checker: {_error(e, 4)}"
                    report.add(label, "FAIL" if problem else "ok", problem)
                    if problem:
                        continue
                    with torch.no_grad():
                        expected = model(*tensors)
                    if dt == torch.bfloat16:
                        report.add(f"ONNX Runtime vs torch, {label}", "skip",
                                   "onnxruntime's Python API takes no bfloat16 arrays (numpy has no bfloat16)")
                        continue
                    feeds = {i.name: t.numpy() for i, t in zip(proto.graph.input, tensors)}
                    for provider in providers:
                        name = f"ONNX Runtime {provider.replace('ExecutionProvider', '')} vs torch, {label}"
                        try:
                            if lowering == "standard":
                                # Stock ONNX Runtime: no custom-op library registered.
                                sess = ort.InferenceSession(proto.SerializeToString(), providers=[provider])
                            else:
                                sess = InferenceSession(proto, providers=[provider])
                            got = sess.run(None, feeds)
                        except Exception as e:
                            report.add(name, "FAIL", _error(e, 6))
                            continue
                        problem = _compare_all(tuple(got), expected, *tol[dt])
                        report.add(name, "FAIL" if problem else "ok", problem)
    _check_dynamic_batch(report, decl, overload, samples, dtypes, tol, exporters)


def _check_dynamic_batch(report: CheckReport, decl: Any, overload: Any, samples: _Samples,
                         dtypes: list[torch.dtype], tol: _Tolerances, exporters: Sequence[str]) -> None:
    """The first sample exported as opbridge.onnx.export does by default (dim 0 of the inputs that
    share the first input's batch made dynamic), run in ONNX Runtime against torch."""
    import opbridge.onnx

    from ._session import InferenceSession

    dt = next((d for d in dtypes if d != torch.bfloat16), None)
    if dt is None:
        return
    args = _cast(samples[0], dt)
    model = _OpModule(overload, args).eval()
    tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
    with torch.no_grad():
        expected = model(*tensors)
    for exporter in exporters:
        label = f"{exporter} export with a dynamic batch (opbridge.onnx.export's default), {_DTYPE_NAMES[dt]}, sample 0"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # export's notes on parameter-like inputs
                proto = opbridge.onnx.export(model, tensors, dynamo=exporter == "dynamo", dynamic_batch=True)
            feeds = {i.name: t.numpy() for i, t in zip(proto.graph.input, tensors)}
            got = InferenceSession(proto, providers=["CPUExecutionProvider"]).run(None, feeds)
        except Exception as e:
            report.add(label, "FAIL", _error(e, 8))
            continue
        dynamic = [i.name for i in proto.graph.input if i.type.tensor_type.shape.dim
                   and i.type.tensor_type.shape.dim[0].HasField("dim_param")]
        problem = _compare_all(tuple(got), expected, *tol[dt])
        report.add(label, "FAIL" if problem else "ok", problem or f"dynamic dim 0: {dynamic or 'none'}")


def _graph_problem(proto: Any, decl: Any, lowering: str) -> str:
    nodes = [n for n in proto.graph.node]
    ours = [n for n in nodes if n.domain == decl.domain and n.op_type == decl.onnx_type]
    if lowering == "custom":
        if len(ours) != 1:
            kinds = sorted({f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in nodes})
            return f"expected one {decl.domain}::{decl.onnx_type} node, the graph has {kinds}"
        return ""
    custom = [n for n in nodes if n.domain in _custom_domains()]
    if custom:
        return (f"lowering 'standard' left nodes that need a custom-op library: "
                f"{sorted({f'{n.domain}::{n.op_type}' for n in custom})}")
    return ""
