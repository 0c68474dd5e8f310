"""Instruments opbridge's own steps of export and optimize, in a process of its own (run by
tests/export/test_large_models.py):

* each step's peak RSS above the RSS it started at (the kernel's high-water mark, reset through
  /proc/self/clear_refs before the step): what the step itself allocated, in Python or in C++
  (onnx's shape inference, ONNX Runtime), whether it kept it or not;
* every read of a large tensor's bytes: the model's tensors over opbridge's bound are replaced by
  recording stand-ins before opbridge's steps see them, which log each call that hands out their
  data (numpy(), __array__, tobytes(), tofile(), raw, dlpack) with the step it happened in.

``python large_model_probe.py export OUT.onnx --gb 0.45 [--dynamo 0]`` exports the model that mixes
every kind of large tensor (benchmarks/benchmarks/_large_model.py); ``python large_model_probe.py
optimize IN.onnx OUT.onnx`` optimizes a model. Both print one JSON line: {"stages": [[name, growth
bytes], ...], "reads": [[tensor, bytes, how, stage], ...], "bound": bytes}.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "benchmarks", "benchmarks"))

STAGES: list[list] = []
READS: list[list] = []
_CURRENT: list[str] = []


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


def _stage(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _reset_peak()
        before = _status("VmRSS")
        _CURRENT.append(name)
        try:
            return fn(*args, **kwargs)
        finally:
            _CURRENT.pop()
            STAGES.append([name, _status("VmHWM") - before])
            _reset_peak()  # the enclosing step's peak counts from here on

    return wrapper


def _patch(module, name: str, label: str | None = None) -> None:
    setattr(module, name, _stage(label or f"{module.__name__}.{name}", getattr(module, name)))


def _recording(tensor):
    """A stand-in for ``tensor`` that logs every call handing out its data."""
    from onnx_ir import _core

    class Recording(_core.TensorBase):
        __slots__ = ("_inner",)

        def __init__(self, inner) -> None:
            super().__init__(name=inner.name, doc_string=inner.doc_string, metadata_props=dict(inner.metadata_props))
            self._inner = inner

        def _log(self, how: str) -> None:
            READS.append([self.name, int(self._inner.nbytes), how, _CURRENT[-1] if _CURRENT else "(caller)"])

        @property
        def dtype(self):
            return self._inner.dtype

        @property
        def shape(self):
            return self._inner.shape

        @property
        def raw(self):
            self._log("raw")
            return self._inner.raw

        def numpy(self):
            self._log("numpy")
            return self._inner.numpy()

        def __array__(self, dtype=None, copy=None):
            self._log("__array__")
            return self._inner.__array__(dtype)

        def __dlpack__(self, *, stream=None):
            self._log("__dlpack__")
            return self._inner.__dlpack__(stream=stream)

        def __dlpack_device__(self):
            return self._inner.__dlpack_device__()

        def tobytes(self) -> bytes:
            self._log("tobytes")
            return self._inner.tobytes()

        def tofile(self, file) -> None:
            self._log("tofile")
            return self._inner.tofile(file)

        def __repr__(self) -> str:
            return f"Recording({self._inner!r})"

    return Recording(tensor)


def _record_large_tensors(model, bound: int) -> None:
    """Every initializer of ``model`` (an onnx_ir Model) over ``bound`` bytes becomes a Recording."""
    for graph in model.graphs():
        for value in graph.initializers.values():
            t = value.const_value
            if t is not None and int(t.nbytes) > bound:
                value.const_value = _recording(t)


def _bound() -> int:
    from opbridge.onnx import _group_norm_fusion as _fusion, _shapes

    return max(_fusion.RULE_CONSTANT_BYTES, _shapes.INFERENCE_TENSOR_BYTES)


def _instrument_common() -> None:
    import onnx_ir as ir

    import opbridge.onnx._external_data as ed
    import opbridge.onnx._rewrite as fusion

    _patch(fusion, "rewrite_model", "rules and rewrites")
    _patch(fusion, "infer_shapes_ir", "shape inference")
    _patch(ir.serde, "serialize_model", "serialization to a ModelProto")
    _patch(ed, "unload", "external data written")


def export(args) -> None:
    import _large_model as L
    import torch

    import opbridge.nn
    import opbridge.onnx
    import opbridge.onnx._dynamic as dynamic
    import opbridge.onnx._export as export_pipeline
    import opbridge.onnx._external_data as ed

    model, inputs = L.build_kind("mixed", args.gb)
    opbridge.nn.convert(model)
    bound = _bound()
    _instrument_common()
    _patch(dynamic, "plan", "dynamic-shape planning")
    _patch(torch.onnx, "export", "torch.onnx.export (torch's own)")
    _patch(export_pipeline, "_type_custom_outputs", "types of custom outputs")
    _patch(export_pipeline, "_finalize", "fix-ups")
    _patch(ed, "save", "model file written")
    write = export_pipeline._write

    @functools.wraps(write)
    def recorded_write(ir_model, *a, **k):
        _record_large_tensors(ir_model, bound)
        return write(ir_model, *a, **k)

    export_pipeline._write = recorded_write
    opbridge.onnx.export(model, inputs, args.out, dynamo=bool(args.dynamo), external_data=True)
    print(json.dumps({"stages": STAGES, "reads": READS, "bound": bound}))


def optimize(args) -> None:
    import opbridge._optimize as opt

    bound = _bound()
    _instrument_common()
    rewrite = opt.rewrite_model

    def recorded_rewrite(model, **kwargs):
        # After optimize has looked at where the tensors are (external data or not).
        _record_large_tensors(model, bound)
        return rewrite(model, **kwargs)

    opt.rewrite_model = _stage("rules and rewrites", recorded_rewrite)
    _patch(opt, "load", "load (memory-mapped)")
    _patch(opt, "save", "model written")
    _patch(opt, "check_against", "ONNX Runtime check")
    _patch(opt, "preflight", "preflight (graph only)")
    with contextlib.redirect_stdout(sys.stderr):
        report = opt.optimize(args.input, args.out)
    if not report.ok:
        raise SystemExit(f"optimize failed: {report.error}")
    print(json.dumps({"stages": STAGES, "reads": READS, "bound": bound}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("out")
    e.add_argument("--gb", type=float, default=0.45)
    e.add_argument("--dynamo", type=int, default=1)
    o = sub.add_parser("optimize")
    o.add_argument("input")
    o.add_argument("out")
    args = p.parse_args()
    {"export": export, "optimize": optimize}[args.cmd](args)


if __name__ == "__main__":
    main()
