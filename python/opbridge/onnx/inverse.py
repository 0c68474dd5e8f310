"""ONNX export of matrix inverses: opbridge::inverse and torch's own (torch.inverse,
torch.linalg.inv).

Two lowerings, one node each, input X (*, n, n) -> output Y:
  custom:   ``ai.opbridge::Inverse``, run by opbridge's ORT library (singular matrices raise an
            error naming the batch index).
  standard: ``com.microsoft::Inverse``, a contrib op every ONNX Runtime build runs, no opbridge
            library needed (singular matrices silently give inf/NaN there).
Per-op lowering keys: "inverse" (opbridge.ops.inverse; default custom) and "torch_inverse"
(torch.inverse / torch.linalg.inv; default standard, so that such models keep running on stock
ONNX Runtime). ``custom_opsets={"com.microsoft": N}`` picks the com.microsoft version
(default 1, the only one ONNX Runtime registers its contrib ops under, up to 1.31 at least).
"""

from __future__ import annotations

import warnings

import onnx

from ._config import DOMAIN, DOMAIN_VERSION, ExportConfig

OPS = ("inverse", "torch_inverse")
OP_TYPE = "Inverse"  # must match opbridge::kInverseOpType in the ORT library
MS_DOMAIN = "com.microsoft"
MS_DOMAIN_VERSION = 1
_DEFAULTS = {"inverse": "custom", "torch_inverse": "standard"}


def _schema(domain: str, version: int) -> onnx.defs.OpSchema:
    S = onnx.defs.OpSchema
    types = ["tensor(float)", "tensor(double)"]
    if domain == MS_DOMAIN:
        types.append("tensor(float16)")
    return S(
        OP_TYPE,
        domain,
        version,
        doc="Inverse of each square matrix of X (*, n, n); Y has X's shape.",
        inputs=[S.FormalParameter("X", "T", "Input matrices (*, n, n)")],
        outputs=[S.FormalParameter("Y", "T", "Their inverses (*, n, n)")],
        type_constraints=[("T", types, "Float tensors")],
    )


def schemas() -> list[onnx.defs.OpSchema]:
    # Only our own domain is registered with onnx; com.microsoft belongs to ONNX Runtime.
    return [_schema(DOMAIN, DOMAIN_VERSION)]


def _target(cfg: ExportConfig, op: str) -> tuple[str, int]:
    """(domain, version) of the node that ``op`` lowers to."""
    if cfg.lowering_for(op, _DEFAULTS[op]) == "custom":
        return DOMAIN, cfg.domain_version(DOMAIN, DOMAIN_VERSION)
    return MS_DOMAIN, cfg.domain_version(MS_DOMAIN, MS_DOMAIN_VERSION)


def _targets(cfg: ExportConfig) -> dict[str, tuple[str, int]]:
    targets = {op: _target(cfg, op) for op in OPS}
    version = cfg.domain_version(MS_DOMAIN, MS_DOMAIN_VERSION)
    if version != MS_DOMAIN_VERSION and any(d == MS_DOMAIN for d, _ in targets.values()):
        warnings.warn(
            f"custom_opsets asks for {MS_DOMAIN} version {version}: ONNX Runtime registers its "
            f"contrib ops (com.microsoft::{OP_TYPE} included) only at version {MS_DOMAIN_VERSION}, "
            "so a model that imports another version does not load there",
            stacklevel=4,
        )
    return targets


def translations(cfg: ExportConfig) -> dict:
    import onnxscript
    import torch

    def lowered(domain: str, version: int):
        # The schema's since_version becomes the node's (and the model's opset import) version.
        op = onnxscript.values.Op(onnxscript.values.Opset(domain, version), OP_TYPE, _schema(domain, version))

        def inverse(x):
            return op(x)

        return inverse

    targets = _targets(cfg)
    ours = lowered(*targets["inverse"])
    torch_own = lowered(*targets["torch_inverse"])
    # torch.export keeps torch.inverse as aten.inverse and torch.linalg.inv as aten.linalg_inv
    # when they have a translation (it would otherwise decompose them into linalg_inv_ex plus an
    # error check, which has no ONNX form).
    return {
        torch.ops.opbridge.inverse.default: ours,
        torch.ops.aten.linalg_inv.default: torch_own,
        torch.ops.aten.inverse.default: torch_own,
    }


def symbolics(cfg: ExportConfig) -> dict:
    def lowered(domain: str):
        def inverse(g, x):
            y = g.op(f"{domain}::{OP_TYPE}", x)
            y.setType(x.type())
            return y

        return inverse

    # The TorchScript exporter takes domain versions from torch.onnx.export(custom_opsets=...),
    # which opbridge.onnx.export fills from cfg.custom_opsets.
    targets = _targets(cfg)
    torch_own = lowered(targets["torch_inverse"][0])
    return {
        "opbridge::inverse": lowered(targets["inverse"][0]),
        "aten::linalg_inv": torch_own,
        "aten::inverse": torch_own,
    }
