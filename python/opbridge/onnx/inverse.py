"""ONNX export of matrix inverses: opbridge::inverse (its custom lowering and schema come from
its declaration, ops/inverse/inverse_decl.cpp) and torch's own (torch.inverse,
torch.linalg.inv).

Two lowerings, one node each, input X (*, n, n) -> output Y:
  custom:   ``ai.opbridge::Inverse``, run by opbridge's ORT library (singular matrices raise an
            error naming the batch index, or give NaN with on_singular="nan").
  standard: ``com.microsoft::Inverse``, a contrib op every ONNX Runtime build runs, no opbridge
            library needed. It has no error path: a singular matrix silently gives inf/NaN there,
            i.e. it can only express on_singular="nan"; exporting "raise" to it warns (once per
            export).
Per-op lowering keys: "inverse" (opbridge.ops.inverse; default custom) and "torch_inverse"
(torch.inverse / torch.linalg.inv; default standard, so that such models keep running on stock
ONNX Runtime). ``custom_opsets={"com.microsoft": N}`` picks the com.microsoft version
(default 1, the only one ONNX Runtime registers its contrib ops under, up to 1.32 at least).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import onnx

from .._library import DOMAIN, MS_DOMAIN
from .._op_library import opbridge_library
from ._config import ExportConfig
from ._registry import once_per_export, standard_lowering

if TYPE_CHECKING:
    from .._declarations import OpDecl
    from ._build import Builder

OP_TYPE = "Inverse"  # the declaration's onnx_type
MS_DOMAIN_VERSION = 1
_KEYS = ("torch_inverse", "aten::linalg_inv", "aten::inverse")


def _ms_schema(version: int) -> onnx.defs.OpSchema:
    S = onnx.defs.OpSchema
    return S(
        OP_TYPE,
        MS_DOMAIN,
        version,
        doc="Inverse of each square matrix of X (*, n, n); Y has X's shape.",
        inputs=[S.FormalParameter("X", "T", "Input matrices (*, n, n)")],
        outputs=[S.FormalParameter("Y", "T", "Their inverses (*, n, n)")],
        type_constraints=[("T", ["tensor(float)", "tensor(double)", "tensor(float16)"], "Float tensors")],
    )


def _ms_version(cfg: ExportConfig) -> int:
    version = cfg.domain_version(MS_DOMAIN, MS_DOMAIN_VERSION)
    if version != MS_DOMAIN_VERSION:
        warnings.warn(
            f"custom_opsets asks for {MS_DOMAIN} version {version}: ONNX Runtime registers its "
            f"contrib ops (com.microsoft::{OP_TYPE} included) only at version {MS_DOMAIN_VERSION}, "
            "so a model that imports another version does not load there",
            stacklevel=5,
        )
    return version


@standard_lowering("opbridge::inverse")
def standard(b: Builder, x: Any, on_singular: str = "raise") -> Any:
    """com.microsoft::Inverse: stock ONNX Runtime runs it; a singular matrix gives inf/NaN there,
    so on_singular="raise" cannot be expressed (warned once per export)."""
    if on_singular == "raise":
        once_per_export("inverse_standard_raise", lambda: warnings.warn(
            "opbridge::inverse exported with the standard lowering (com.microsoft::Inverse), which cannot raise: "
            "a singular matrix gives inf/NaN there, as with on_singular='nan'; keep lowering 'custom' for "
            "on_singular='raise'",
            stacklevel=6,
        ))
    return b.custom(MS_DOMAIN, MS_DOMAIN_VERSION, OP_TYPE, _ms_schema(MS_DOMAIN_VERSION), x)


class _TorchInverse:
    """torch.inverse / torch.linalg.inv: standard (com.microsoft::Inverse) by default, so that such
    models keep running on stock ONNX Runtime; "custom" makes them ai.opbridge::Inverse nodes."""

    OPS = _KEYS

    def _custom(self) -> OpDecl:
        return opbridge_library().ops["inverse"]

    def translations(self, cfg: ExportConfig) -> dict[Any, Any]:
        import onnxscript
        import torch

        from ._declared_export import schemas

        if cfg.lowering_for(_KEYS, "standard") == "custom":
            op = self._custom()
            node = onnxscript.values.Op(onnxscript.values.Opset(DOMAIN, op.since), OP_TYPE, schemas(op)[0])
        else:
            version = _ms_version(cfg)
            node = onnxscript.values.Op(onnxscript.values.Opset(MS_DOMAIN, version), OP_TYPE, _ms_schema(version))

        # Types as a comment: the exporter reads a translation's annotations as ONNX type constraints.
        def inverse(x):  # type: (Any) -> Any
            return node(x)

        # torch.export keeps torch.inverse as aten.inverse and torch.linalg.inv as aten.linalg_inv
        # when they have a translation (it would otherwise decompose them into linalg_inv_ex plus an
        # error check, which has no ONNX form).
        return {torch.ops.aten.linalg_inv.default: inverse, torch.ops.aten.inverse.default: inverse}

    def symbolics(self, cfg: ExportConfig) -> dict[Any, Any]:
        # The TorchScript exporter takes domain versions from torch.onnx.export(custom_opsets=...),
        # which opbridge.onnx.export fills from cfg.custom_opsets.
        if cfg.lowering_for(_KEYS, "standard") == "custom":
            domain = DOMAIN
        else:
            domain = MS_DOMAIN
            _ms_version(cfg)

        def inverse(g, x):  # type: (Any, Any) -> Any
            y = g.op(f"{domain}::{OP_TYPE}", x)
            y.setType(x.type())
            return y

        return {"aten::linalg_inv": inverse, "aten::inverse": inverse}


RULES = _TorchInverse()
