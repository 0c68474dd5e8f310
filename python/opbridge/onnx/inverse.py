"""ONNX export of matrix inverses: opbridge::inverse and torch's own (torch.inverse,
torch.linalg.inv).

Two lowerings, one node each, input X (*, n, n) -> output Y:
  custom:   ``ai.opbridge::Inverse``, run by opbridge's ORT library. Its string attribute
            ``on_singular`` (since domain version 2) carries opbridge.ops.inverse's argument:
            "raise" (the default, so never written: the node stays a version-1 node) makes a
            singular matrix an error naming the batch index; "nan" makes that matrix's output NaN.
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

import onnx

from ._config import DOMAIN, DOMAIN_VERSION, ExportConfig

OPS = ("inverse", "torch_inverse")
OP_TYPE = "Inverse"  # must match opbridge::kInverseOpType in the ORT library
MS_DOMAIN = "com.microsoft"
MS_DOMAIN_VERSION = 1
_DEFAULTS = {"inverse": "custom", "torch_inverse": "standard"}
# The on_singular attribute (opbridge::kInverseOnSingularAttr): its values, its default, and the
# ai.opbridge version that introduced it.
ON_SINGULAR = ("raise", "nan")
ON_SINGULAR_DEFAULT = "raise"
ON_SINGULAR_SINCE = 2


def _schema(domain: str, version: int) -> onnx.defs.OpSchema:
    S = onnx.defs.OpSchema
    types = ["tensor(float)", "tensor(double)"]
    attributes = []
    if domain == MS_DOMAIN:
        types.append("tensor(float16)")
    elif version >= ON_SINGULAR_SINCE:
        attributes.append(S.Attribute(
            "on_singular", onnx.helper.make_attribute("on_singular", ON_SINGULAR_DEFAULT),
            "What a singular matrix does: 'raise' (the run fails with an error naming its batch index) or "
            "'nan' (its output is all NaN; the other matrices are inverted as usual)"))
    return S(
        OP_TYPE,
        domain,
        version,
        doc="Inverse of each square matrix of X (*, n, n); Y has X's shape.",
        inputs=[S.FormalParameter("X", "T", "Input matrices (*, n, n)")],
        outputs=[S.FormalParameter("Y", "T", "Their inverses (*, n, n)")],
        type_constraints=[("T", types, "Float tensors")],
        attributes=attributes,
    )


def schemas() -> list[onnx.defs.OpSchema]:
    # Only our own domain is registered with onnx; com.microsoft belongs to ONNX Runtime.
    # Version 1 has no attribute; version 2 adds on_singular.
    return [_schema(DOMAIN, DOMAIN_VERSION), _schema(DOMAIN, ON_SINGULAR_SINCE)]


def required_version(node: onnx.NodeProto) -> int:
    """The lowest ai.opbridge version in which ``node`` (an ai.opbridge::Inverse) is valid."""
    return ON_SINGULAR_SINCE if any(a.name == "on_singular" for a in node.attribute) else DOMAIN_VERSION


def _check_on_singular(value: object) -> str:
    if value not in ON_SINGULAR:
        raise ValueError(f"opbridge::inverse: on_singular must be 'raise' or 'nan', got {value!r}")
    return str(value)


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


class _Node:
    """What one opbridge::inverse call becomes, shared by both exporters: the node's domain, its
    version and its attributes. Warns (once per export, i.e. per _Node) when "raise" is lowered to
    com.microsoft::Inverse, which cannot raise."""

    def __init__(self, cfg: ExportConfig, domain: str, version: int) -> None:
        self.cfg, self.domain, self.version = cfg, domain, version
        self._warned = False

    def attributes(self, on_singular: object) -> tuple[int, dict]:
        """(node version, attributes) for a call with this on_singular."""
        value = _check_on_singular(on_singular)
        if self.domain == MS_DOMAIN:
            if value == "raise" and not self._warned:
                self._warned = True
                warnings.warn(
                    "opbridge.ops.inverse(on_singular='raise') is exported to com.microsoft::Inverse "
                    "(lowering 'standard'), which cannot raise: a singular matrix gives inf/NaN in that "
                    "item's output instead of an error. Use lowering={'inverse': 'custom'} (ai.opbridge::Inverse, "
                    "which raises) or on_singular='nan' to say that NaN is what you want.",
                    UserWarning,
                    stacklevel=2,
                )
            return self.version, {}
        if value == ON_SINGULAR_DEFAULT:
            return self.version, {}  # the default is never written: the node stays a version-1 node
        if DOMAIN in self.cfg.custom_opsets and self.version < ON_SINGULAR_SINCE:
            raise ValueError(
                f"opbridge::inverse(on_singular={value!r}) needs {DOMAIN} version >= {ON_SINGULAR_SINCE} "
                f"(the on_singular attribute of {DOMAIN}::{OP_TYPE}), but custom_opsets asks for version "
                f"{self.version}")
        return max(self.version, ON_SINGULAR_SINCE), {"on_singular": value}


def translations(cfg: ExportConfig) -> dict:
    import onnxscript
    import torch

    def make_op(domain: str, version: int):
        # The schema's since_version becomes the node's (and the model's opset import) version.
        return onnxscript.values.Op(onnxscript.values.Opset(domain, version), OP_TYPE, _schema(domain, version))

    targets = _targets(cfg)
    ours = _Node(cfg, *targets["inverse"])
    ops = {}

    def inverse(x, on_singular: str = ON_SINGULAR_DEFAULT):
        version, attrs = ours.attributes(on_singular)
        if version not in ops:
            ops[version] = make_op(ours.domain, version)
        return ops[version](x, **attrs)

    torch_op = make_op(*targets["torch_inverse"])

    def torch_inverse(x):
        return torch_op(x)

    # torch.export keeps torch.inverse as aten.inverse and torch.linalg.inv as aten.linalg_inv
    # when they have a translation (it would otherwise decompose them into linalg_inv_ex plus an
    # error check, which has no ONNX form).
    return {
        torch.ops.opbridge.inverse.default: inverse,
        torch.ops.aten.linalg_inv.default: torch_inverse,
        torch.ops.aten.inverse.default: torch_inverse,
    }


def symbolics(cfg: ExportConfig) -> dict:
    from torch.onnx import symbolic_helper as sh

    def torch_lowered(domain: str):
        def inverse(g, x):
            y = g.op(f"{domain}::{OP_TYPE}", x)
            y.setType(x.type())
            return y

        return inverse

    # The TorchScript exporter takes domain versions from torch.onnx.export(custom_opsets=...),
    # which opbridge.onnx.export fills from cfg.custom_opsets; a node that needs a newer version
    # than that (on_singular) raises the model's import afterwards (required_version).
    targets = _targets(cfg)
    ours = _Node(cfg, *targets["inverse"])

    @sh.parse_args("v", "s")
    def inverse(g, x, on_singular):
        _, attrs = ours.attributes(on_singular)
        y = g.op(f"{ours.domain}::{OP_TYPE}", x, **{f"{k}_s": v for k, v in attrs.items()})
        y.setType(x.type())
        return y

    torch_own = torch_lowered(targets["torch_inverse"][0])
    return {
        "opbridge::inverse": inverse,
        "aten::linalg_inv": torch_own,
        "aten::inverse": torch_own,
    }
