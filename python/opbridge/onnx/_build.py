"""One graph-building interface over both torch exporters, so that a lowering made of several
standard ONNX nodes is written once and serves the dynamo translation and the TorchScript symbolic.

    def lower(b: Builder, x, ...):
        y = b.op("Reshape", x, b.const_ints([0, 2, -1]))
        return b.op("InstanceNormalization", y, s, t, epsilon=1e-5)

``b.op`` takes attributes as plain Python values (int, float, list of int, TensorProto); each
exporter's spelling (``epsilon_f=`` for TorchScript) is the builder's business.
"""

from __future__ import annotations

from typing import Any, Sequence

import onnx
from onnx import TensorProto

# Oldest onnxscript opset the dynamo exporter's own ops use (torchlib); lower export opsets are
# reached by converting the model afterwards (see opbridge.onnx.export).
_DYNAMO_MIN_OPSET = 18


class Builder:
    """Emits nodes into the graph an exporter is building.

    target_opset: the default-domain opset of the exported model; lowerings choose between
        alternatives with it (e.g. GroupNormalization-21 needs 21).
    opset: the opset whose op signatures the emitted nodes must follow (ReduceMean takes axes as
        an input from 18 on). Equals target_opset except for the dynamo exporter below 18, which
        builds at 18 and converts the model down afterwards.
    """

    target_opset: int
    opset: int

    def op(self, op_type: str, *inputs: Any, **attrs: Any) -> Any:  # pragma: no cover - interface
        raise NotImplementedError

    def is_none(self, value: Any) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def rank(self, value: Any) -> int | None:  # pragma: no cover - interface
        raise NotImplementedError

    def dim(self, value: Any, axis: int) -> int | None:  # pragma: no cover - interface
        """Static size of dimension ``axis``, or None when symbolic/unknown."""
        raise NotImplementedError

    def elem_type(self, value: Any) -> int:  # pragma: no cover - interface
        """ONNX element type (TensorProto.FLOAT, ...) of a tensor value."""
        raise NotImplementedError

    def const_ints(self, values: Sequence[int]) -> Any:
        return self.op("Constant", value_ints=[int(v) for v in values])

    def custom(self, domain: str, version: int, op_type: str, schema: onnx.defs.OpSchema, *inputs: Any,
               **attrs: Any) -> Any:  # pragma: no cover - interface
        """One node of a custom domain (``schema`` describes it for onnxscript)."""
        raise NotImplementedError

    def const(self, elem_type: int, dims: Sequence[int], values: Sequence[float]) -> Any:
        """A Constant of ONNX element type ``elem_type``."""
        return self.op("Constant", value=onnx.helper.make_tensor("value", elem_type, list(dims), list(values)))

    @staticmethod
    def scalar_tensor(elem_type: int, value: float) -> TensorProto:
        """A one-element TensorProto (for ConstantOfShape's ``value``)."""
        return onnx.helper.make_tensor("value", elem_type, [1], [value])


class DynamoBuilder(Builder):
    """Builder for a ``custom_translation_table`` function of the dynamo exporter (onnxscript)."""

    def __init__(self, opset: int) -> None:
        import onnxscript

        self.target_opset = int(opset)
        version = max(_DYNAMO_MIN_OPSET, self.target_opset)
        # The newest onnxscript opset module not newer than the export's opset.
        while version > _DYNAMO_MIN_OPSET and not hasattr(onnxscript, f"opset{version}"):
            version -= 1
        self.opset = version
        self._ops = getattr(onnxscript, f"opset{version}")

    def op(self, op_type: str, *inputs: Any, **attrs: Any) -> Any:
        return getattr(self._ops, op_type)(*inputs, **attrs)

    def custom(self, domain: str, version: int, op_type: str, schema: onnx.defs.OpSchema, *inputs: Any,
               **attrs: Any) -> Any:
        import onnxscript

        return onnxscript.values.Op(onnxscript.values.Opset(domain, version), op_type, schema)(*inputs, **attrs)

    def is_none(self, value: Any) -> bool:
        return value is None

    def rank(self, value: Any) -> int | None:
        shape = getattr(value, "shape", None)
        return None if shape is None else len(shape)

    def dim(self, value: Any, axis: int) -> int | None:
        shape = getattr(value, "shape", None)
        if shape is None or axis >= len(shape):
            return None
        d = shape[axis]
        return d if isinstance(d, int) else None

    def elem_type(self, value: Any) -> int:
        return int(value.dtype)


class TorchScriptBuilder(Builder):
    """Builder for a TorchScript-exporter symbolic function (``g`` is its GraphContext)."""

    def __init__(self, g: Any) -> None:
        self.g = g
        self.target_opset = self.opset = int(g.opset)

    def op(self, op_type: str, *inputs: Any, **attrs: Any) -> Any:
        typed: dict[str, Any] = {}
        for name, v in attrs.items():
            if isinstance(v, bool) or isinstance(v, int):
                typed[f"{name}_i"] = int(v)
            elif isinstance(v, float):
                typed[f"{name}_f"] = v
            elif isinstance(v, (list, tuple)) and all(isinstance(e, int) for e in v):
                typed[f"{name}_i"] = [int(e) for e in v]
            elif isinstance(v, (list, tuple)):
                typed[f"{name}_f"] = [float(e) for e in v]
            elif isinstance(v, TensorProto):
                typed[f"{name}_t"] = _torch_tensor(v)
            elif isinstance(v, str):
                typed[f"{name}_s"] = v
            else:
                raise TypeError(f"attribute {name!r} of {op_type}: unsupported value {v!r}")
        inputs = tuple(self._none() if i is None else i for i in inputs)
        return self.g.op(op_type, *inputs, **typed)

    def custom(self, domain: str, version: int, op_type: str, schema: onnx.defs.OpSchema, *inputs: Any,
               **attrs: Any) -> Any:
        return self.op(f"{domain}::{op_type}", *inputs, **attrs)

    def _none(self) -> Any:
        from torch.onnx import symbolic_helper as sh

        return sh._optional_input_placeholder_tensor(self.g)

    def is_none(self, value: Any) -> bool:
        from torch.onnx import symbolic_helper as sh

        return value is None or sh._is_none(value)

    def rank(self, value: Any) -> int | None:
        from torch.onnx import symbolic_helper as sh

        return sh._get_tensor_rank(value)

    def dim(self, value: Any, axis: int) -> int | None:
        from torch.onnx import symbolic_helper as sh

        return sh._get_tensor_dim_size(value, axis)

    def elem_type(self, value: Any) -> int:
        return int(_jit_scalar_type().from_value(value).onnx_type())

    def const_ints(self, values: Sequence[int]) -> Any:
        import torch

        return self.g.op("Constant", value_t=torch.tensor([int(v) for v in values], dtype=torch.int64))


def _jit_scalar_type() -> Any:
    try:  # torch >= 2.9 keeps the TorchScript exporter's helpers here
        from torch.onnx._internal.torchscript_exporter._type_utils import JitScalarType
    except ImportError:  # pragma: no cover - older torch
        from torch.onnx._type_utils import JitScalarType  # type: ignore[import-not-found,no-redef]
    return JitScalarType


def _torch_tensor(t: TensorProto) -> Any:
    """TensorProto -> torch tensor of the same element type (bfloat16 included)."""
    import numpy as np
    import torch

    dtype = _jit_scalar_type().from_onnx_type(t.data_type).dtype()
    values = np.asarray(onnx.numpy_helper.to_array(t)).astype(np.float64 if dtype.is_floating_point else np.int64)
    return torch.from_numpy(values).to(dtype)
