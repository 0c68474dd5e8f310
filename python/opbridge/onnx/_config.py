"""Export configuration shared by the per-op export modules."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Union, cast


DOMAIN_VERSION = 1
"""The lowest version of the ``ai.opbridge`` domain; an exported model imports it unless an op or an
attribute it uses needs a later one (``custom_opsets`` names one explicitly)."""

LOWERINGS = ("custom", "standard")
"""How an op is exported: ``"custom"`` (one ``ai.opbridge`` node) or ``"standard"`` (standard ONNX ops)."""

# Default-domain opset when the caller names none. TorchScript exporter: 17 (the oldest opset the
# project tests, loads on every ONNX Runtime >= 1.17). Dynamo exporter: torch's own default.
TORCHSCRIPT_DEFAULT_OPSET = 17
_DYNAMO_FALLBACK_OPSET = 20  # torch 2.13's default, for a torch that does not expose it


def default_opset(dynamo: bool) -> int:
    if not dynamo:
        return TORCHSCRIPT_DEFAULT_OPSET
    try:
        from torch.onnx._constants import ONNX_DEFAULT_OPSET

        return int(ONNX_DEFAULT_OPSET)
    except ImportError:  # pragma: no cover - depends on torch's private layout
        return _DYNAMO_FALLBACK_OPSET


Lowering = Optional[Union[str, Mapping[str, str]]]


@dataclass(frozen=True)
class ExportConfig:
    """How each op is lowered and which versions custom domains get.

    lowering: "custom" (an ``ai.opbridge`` node, needs opbridge's ORT library) or "standard"
        (standard ONNX / ORT contrib ops, runs on stock ONNX Runtime) for all ops; or a
        mapping op name -> lowering, where ops not named keep their own default; or None: every
        op its own default (see ``lowering_for``).
    custom_opsets: domain -> opset version for custom domains (e.g. {"com.microsoft": 1}).
    opset_version: the default-domain opset of the export (None: the exporter's default).
    default_lowering: the default of ops that do not declare their own.
    """

    lowering: Lowering = None
    custom_opsets: Mapping[str, int] = field(default_factory=dict)
    opset_version: int | None = None
    default_lowering: str = "custom"

    def lowering_for(self, op: str | tuple[str, ...], default: str | None = None) -> str:
        """The lowering of ``op``: a ``lowering`` key, or a tuple of the keys one op answers to
        (``("opbridge::group_norm", "group_norm")``). ``default`` is the op's own default (e.g.
        "standard" for torch's inverse, which then runs on stock ONNX Runtime); it applies unless
        the user chose a lowering for all ops or named this one."""
        keys = (op,) if isinstance(op, str) else tuple(op)
        named = [k for k in keys if self.lowering is not None and not isinstance(self.lowering, str) and k in self.lowering]
        if isinstance(self.lowering, str):
            value = self.lowering
        elif named:
            value = cast("Mapping[str, str]", self.lowering)[named[0]]
        else:
            value = default or self.default_lowering
        op = keys[0]
        if value not in LOWERINGS:
            raise ValueError(f"lowering for {op!r} must be one of {LOWERINGS}, got {value!r}")
        return value

    def resolved_opset(self, dynamo: bool) -> int:
        """The export's default-domain opset: opset_version, or the exporter's default."""
        return int(self.opset_version) if self.opset_version is not None else default_opset(dynamo)

    def domain_version(self, domain: str, default: int) -> int:
        return int(self.custom_opsets.get(domain, default))
