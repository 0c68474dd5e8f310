"""Export glue for ops of your own (built with the CMake function opbridge_add_op), from a
small declaration: a translation for the dynamo exporter, a symbolic for the TorchScript
exporter and an ONNX OpSchema, all derived from the torch op's schema.

    import opbridge.onnx

    LOG_CUMSUM_EXP = opbridge.onnx.declare_op(
        "userops::log_cumsum_exp",        # the torch op (its library must be loaded)
        domain="com.example.userops",     # the DOMAIN of your ORT library
        op_type="LogCumSumExp",           # the name your ORT op registers
        attributes={"dim": "axis"},       # torch argument -> ONNX attribute, where they differ
    )
    opbridge.onnx.export(model, args, "model.onnx")              # dynamo, or dynamo=False

Every Tensor / Tensor? argument becomes an input (in order; None: omitted optional input), every
other argument an attribute (int/SymInt/bool -> INT, float -> FLOAT, str -> STRING, int[] -> INTS,
float[] -> FLOATS; a None value is left out). All tensor inputs and outputs share one type T.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Sequence, cast

import onnx

from .._declarations import attr_value
from .._library import DOMAIN as OPBRIDGE_DOMAIN
from ._config import ExportConfig

__all__ = ["CustomOp", "declare_op", "FLOAT_TYPES"]

FLOAT_TYPES = ("tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)")

# torch argument type kind -> (ONNX attribute type, TorchScript-exporter descriptor, g.op suffix)
_SCALARS = {
    "IntType": (onnx.defs.OpSchema.AttrType.INT, "i", "i"),
    "SymIntType": (onnx.defs.OpSchema.AttrType.INT, "i", "i"),
    "BoolType": (onnx.defs.OpSchema.AttrType.INT, "b", "i"),
    "FloatType": (onnx.defs.OpSchema.AttrType.FLOAT, "f", "f"),
    "StringType": (onnx.defs.OpSchema.AttrType.STRING, "s", "s"),
}
_LISTS = {
    "IntType": (onnx.defs.OpSchema.AttrType.INTS, "is", "i"),
    "SymIntType": (onnx.defs.OpSchema.AttrType.INTS, "is", "i"),
    "FloatType": (onnx.defs.OpSchema.AttrType.FLOATS, "fs", "f"),
}

# TorchScript-exporter descriptor -> declaration attribute type (the Python type of the value)
_DESC_TYPES = {"b": "bool", "i": "int", "f": "float", "is": "int[]", "fs": "float[]"}


class _Arg:
    """One argument of the torch op, as the export sees it."""

    def __init__(self, torch_arg: Any, onnx_name: str):
        self.name = torch_arg.name
        self.onnx_name = onnx_name
        self.kwarg_only = bool(torch_arg.kwarg_only)
        self.has_default = bool(torch_arg.has_default_value())
        self.default = torch_arg.default_value
        t = torch_arg.type
        self.optional = t.kind() == "OptionalType"
        if self.optional:
            t = t.getElementType()
        self.is_tensor = t.kind() == "TensorType"
        self.attr_type = self.desc = self.suffix = None
        if self.is_tensor:
            return
        if t.kind() in _SCALARS:
            self.attr_type, self.desc, self.suffix = _SCALARS[t.kind()]
        elif t.kind() == "ListType" and t.getElementType().kind() in _LISTS:
            self.attr_type, self.desc, self.suffix = _LISTS[t.getElementType().kind()]
        else:
            raise TypeError(
                f"argument {self.name!r} has type {torch_arg.type}, which declare_op cannot map to an ONNX "
                "attribute (expected Tensor, Tensor?, int, bool, float, str, int[] or float[])"
            )

    def to_attr(self, value: Any) -> Any:
        value = attr_value(_DESC_TYPES.get(cast(str, self.desc), ""), value)
        # ONNX has no bool attribute: a bool travels as an INT.
        return int(value) if self.desc == "b" else value


class CustomOp:
    """The export rules of one op of your own: see ``declare_op``. Has the interface of an
    opbridge.onnx op module (``OPS``, ``schemas()``, ``translations(cfg)``, ``symbolics(cfg)``), so
    a registered declaration is covered by ``opbridge.onnx.export``, ``translation_table()`` and
    ``register_symbolics()``."""

    def __init__(self, torch_op: str, domain: str, op_type: str, attributes: Mapping[str, str],
                 version: int, dtypes: Sequence[str], output_like: int | None, doc: str):
        import torch

        ns, sep, name = torch_op.partition("::")
        if not sep or not ns or not name or "." in name:
            raise ValueError(f"torch_op must be 'namespace::op_name', got {torch_op!r}")
        if not domain or domain == OPBRIDGE_DOMAIN:
            raise ValueError(f"domain must be the (non-empty) ONNX domain of your own ORT library, not {domain!r}")
        if not op_type:
            raise ValueError("op_type must be the ONNX op type your ORT library registers, got an empty string")
        try:
            self.overload = getattr(getattr(torch.ops, ns), name).default
        except (AttributeError, RuntimeError) as e:
            raise ValueError(
                f"torch op {torch_op!r} does not exist: load your torch extension "
                "(torch.ops.load_library) before declaring its export"
            ) from e
        self.torch_op, self.domain, self.op_type = torch_op, domain, op_type
        self.version, self.dtypes, self.doc = int(version), tuple(dtypes), doc
        self.OPS = (torch_op,)
        schema = self.overload._schema
        unknown = set(attributes) - {a.name for a in schema.arguments}
        if unknown:
            raise ValueError(f"attributes names arguments that {torch_op} does not have: {sorted(unknown)}")
        self.args = [_Arg(a, attributes.get(a.name, a.name)) for a in schema.arguments]
        for a in self.args:
            if a.is_tensor and a.name in attributes:
                raise ValueError(f"attributes: {a.name!r} is a tensor argument (an input), not an attribute")
        self.n_outputs = len(schema.returns)
        if not self.n_outputs or any(r.type.kind() != "TensorType" for r in schema.returns):
            raise TypeError(f"{torch_op} must return one or more Tensors to be exported, returns {schema.returns}")
        tensors = [a for a in self.args if a.is_tensor]
        if output_like is not None and not 0 <= output_like < len(tensors):
            raise ValueError(f"output_like must index one of the {len(tensors)} tensor inputs, got {output_like}")
        self.output_like = output_like
        self._signature = inspect.Signature([
            inspect.Parameter(
                a.name,
                inspect.Parameter.KEYWORD_ONLY if a.kwarg_only else inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=a.default if a.has_default else inspect.Parameter.empty,
            )
            for a in self.args
        ])

    def __repr__(self) -> str:
        return f"CustomOp({self.torch_op!r} -> {self.domain}::{self.op_type}, version {self.version})"

    # ---- ONNX schema ----
    def schema(self) -> onnx.defs.OpSchema:
        S = onnx.defs.OpSchema
        inputs = [
            S.FormalParameter(a.onnx_name, "T", f"torch argument {a.name}",
                              param_option=S.FormalParameterOption.Optional if a.optional else S.FormalParameterOption.Single)
            for a in self.args if a.is_tensor
        ]
        outputs = [S.FormalParameter(f"output_{i}" if self.n_outputs > 1 else "Y", "T", "") for i in range(self.n_outputs)]
        attrs = []
        for a in self.args:
            if a.is_tensor:
                continue
            if a.has_default and a.default is not None:
                attrs.append(S.Attribute(a.onnx_name, onnx.helper.make_attribute(a.onnx_name, a.to_attr(a.default)),
                                         f"torch argument {a.name}"))
            else:
                attrs.append(S.Attribute(a.onnx_name, cast("onnx.defs.OpSchema.AttrType", a.attr_type),
                                         f"torch argument {a.name}",
                                         required=not (a.optional or a.has_default)))
        return S(self.op_type, self.domain, self.version, doc=self.doc or f"Export of {self.torch_op}",
                 inputs=inputs, outputs=outputs, type_constraints=[("T", list(self.dtypes), "tensor types")],
                 attributes=attrs)

    def schemas(self) -> list[onnx.defs.OpSchema]:
        return [self.schema()]

    def register_schema(self) -> None:
        """Registers the OpSchema with onnx (once), for onnx.checker and shape inference."""
        if not onnx.defs.has(self.op_type, self.version, self.domain):
            onnx.defs.register_schema(self.schema())

    @property
    def opset_imports(self) -> dict[str, int]:
        """{domain: version}, e.g. for ``custom_opsets=`` of the TorchScript exporter."""
        return {self.domain: self.version}

    def _check_lowering(self, cfg: ExportConfig | None) -> None:
        # A declared op has one lowering, its custom node; only an explicit request for another fails.
        if cfg is not None and cfg.lowering is not None and not isinstance(cfg.lowering, str):
            lowering = cfg.lowering.get(self.torch_op, "custom")
            if lowering != "custom":
                raise NotImplementedError(f"{self.torch_op}: lowering {lowering!r} is not available (only 'custom')")

    def _split(self, bound: inspect.BoundArguments) -> tuple[list[Any], dict[str, Any]]:
        inputs, attrs = [], {}
        for a in self.args:
            value = bound.arguments[a.name]
            if a.is_tensor:
                inputs.append(value)
            elif value is not None:
                attrs[a.onnx_name] = a.to_attr(value)
        return inputs, attrs

    # ---- dynamo exporter ----
    def translation(self) -> Callable[..., Any]:
        """The onnxscript translation of the torch op (a ``custom_translation_table`` value)."""
        import onnxscript

        self.register_schema()
        op = onnxscript.values.Op(onnxscript.values.Opset(self.domain, self.version), self.op_type, self.schema())
        signature = self._signature

        def translate(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            inputs, attrs = self._split(bound)
            while inputs and inputs[-1] is None:  # trailing omitted inputs are simply absent
                inputs.pop()
            return op(*inputs, **attrs)

        translate.__name__ = translate.__qualname__ = self.torch_op.replace("::", "_")
        translate.__signature__ = signature  # type: ignore[attr-defined]
        return translate

    def translations(self, cfg: ExportConfig | None = None) -> dict[Callable[..., Any], Callable[..., Any]]:
        self._check_lowering(cfg)
        return {self.overload: self.translation()}

    def translation_table(self) -> dict[Callable[..., Any], Callable[..., Any]]:
        """``{torch op overload: translation}`` for ``torch.onnx.export(..., custom_translation_table=)``."""
        return self.translations()

    # ---- TorchScript exporter ----
    def symbolic(self) -> Callable[..., Any]:
        """The TorchScript-exporter symbolic (for ``torch.onnx.register_custom_op_symbolic``)."""
        from torch.onnx import symbolic_helper as sh

        qualified = f"{self.domain}::{self.op_type}"

        def symbolic(g: Any, *args: Any) -> Any:
            bound = self._signature.bind(*args)
            inputs, attrs = [], {}
            for a in self.args:
                value = bound.arguments.get(a.name)
                if a.is_tensor:
                    inputs.append(sh._optional_input_placeholder_tensor(g) if sh._is_none(value) else value)
                elif not sh._is_none(value):
                    attrs[f"{a.onnx_name}_{a.suffix}"] = a.to_attr(sh._get_const(value, a.desc, a.name))
            outs = g.op(qualified, *inputs, outputs=self.n_outputs, **attrs)
            if self.output_like is not None:
                like = cast(Any, inputs[self.output_like])
                for o in outs if self.n_outputs > 1 else (outs,):
                    o.setType(like.type())
            return outs

        return symbolic

    def symbolics(self, cfg: ExportConfig | None = None) -> dict[str, Callable[..., Any]]:
        self._check_lowering(cfg)
        return {self.torch_op: self.symbolic()}

    def register_symbolic(self) -> None:
        """Registers the symbolic with the TorchScript exporter (for every default-domain opset)."""
        import torch

        torch.onnx.register_custom_op_symbolic(self.torch_op, self.symbolic(), 1)  # type: ignore[attr-defined]


def declare_op(
    torch_op: str,
    *,
    domain: str,
    op_type: str,
    attributes: Mapping[str, str] | None = None,
    version: int = 1,
    dtypes: Sequence[str] = FLOAT_TYPES,
    output_like: int | None = 0,
    doc: str = "",
    register: bool = True,
) -> CustomOp:
    """Declares how the torch op ``torch_op`` ("namespace::name", already loaded) exports: as one
    node ``domain::op_type`` (opset ``version`` of ``domain``), run by your ORT custom-op library.

    attributes: torch argument name -> ONNX attribute name, for the non-tensor arguments whose
        names differ (the others keep their torch names).
    dtypes: the tensor types of the schema's type constraint T (shared by all inputs/outputs).
    output_like: index of the tensor input whose type (dtype and shape) the TorchScript exporter
        gives the outputs; None to leave them untyped (for ops that change the shape).
    register: add the declaration to opbridge.onnx, so that ``opbridge.onnx.export``,
        ``translation_table()`` and ``register_symbolics()`` include it (a later declaration of
        the same torch op replaces it). Without it, use the returned object's
        ``translation_table()`` / ``register_symbolic()`` with torch.onnx.export directly.
    """
    op = CustomOp(torch_op, domain, op_type, dict(attributes or {}), version, dtypes, output_like, doc)
    op.register_schema()
    if register:
        from ._registry import add_declared_op

        add_declared_op(op)
    return op
