"""Rewriting ONNX models into opbridge's nodes: the GroupNorm fusion (_group_norm_fusion.py) and
multi-scale deformable attention (_msda_rules.py), run stage by stage with onnxscript's pattern
rewriter. ``opbridge.onnx.export(fuse=True)`` runs it on the exporter's model (EXPORT_SOURCES);
``opbridge optimize`` (opbridge/_optimize.py) on models exported by anyone (SOURCES). Needs
onnx_ir and onnxscript; not torch."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Sequence

from . import _group_norm_fusion

__all__ = ["EXPORT_SOURCES", "SOURCES", "RewriteResult", "fuse_exported", "infer_shapes_ir", "rewrite_model"]

# What each caller may rewrite: optimize takes every source; export only what torch emits.
# "msda": multi-scale deformable attention (onnx/_msda_rules.py).
SOURCES = ("decomposition", "gn18", "gn21", "com.microsoft", "msda")
EXPORT_SOURCES = ("decomposition", "gn18", "gn21")


@dataclasses.dataclass
class RewriteResult:
    counts: dict[str, int]
    skipped: list[str]

    @property
    def changed(self) -> bool:
        return any(self.counts.values())


def rewrite_model(model: Any, *, silu: bool = True, sources: Sequence[str] = SOURCES) -> RewriteResult:
    """Rewrites ``model`` (an onnx_ir Model) in place; returns what changed per pattern."""
    import onnx_ir.passes.common as passes
    from onnxscript.rewriter import pattern

    unknown = set(sources) - set(SOURCES)
    if unknown:
        raise ValueError(f"sources: unknown {sorted(unknown)}; expected a subset of {SOURCES}")
    infer_shapes_ir(model)
    # (label, rules, what to run after them when they changed something)
    stages: list[tuple[str, list[Any], Callable[[Any], Any] | None]]
    stages, silu_stages, session = _group_norm_fusion.rule_stages(sources, silu)
    msda = None
    if "msda" in sources:
        from . import _msda_rules

        msda = _msda_rules.Session(model.graph.initializers)
        # One pass per rule, longest form first: in one pass the shortest form would match at the
        # ReduceSum before a longer one reaches the node that ends it.
        stages += [(_msda_rules.LABEL, [rule], _msda_rules.finish) for rule in _msda_rules.rules(msda)]
    stages += silu_stages

    counts: dict[str, int] = {}
    for label, rules, after in stages:
        n = pattern.RewriteRuleSet(rules, commute=True).apply_to_model(model)
        counts[label] = counts.get(label, 0) + n
        if n and after is not None:
            after(model)
    if any(counts.values()):
        # What only the replaced nodes read (Shape(X), the grouping shape, per-group scales).
        passes.RemoveUnusedNodesPass()(model)
        passes.RemoveUnusedOpsetsPass()(model)
        _group_norm_fusion.finish(model)
    skipped = list(session.skipped) + (_msda_rules.leftovers(model, msda) if msda is not None else [])
    return RewriteResult(counts=counts, skipped=skipped)


def infer_shapes_ir(model: Any) -> None:
    """Types and shapes of the intermediate values, which the rules check and which some exporters
    (TorchScript) do not record: onnx's inference with data propagation, opbridge's schemas
    registered so that it sees through existing ai.opbridge nodes, in memory bounded by the graph
    (onnx/_shapes.py). Best effort: a model onnx cannot infer keeps what it has (and the rules
    skip what they cannot verify)."""
    from ._shapes import infer_shapes_ir as infer

    infer(model)


def fuse_exported(proto: Any, *, silu: bool = True, path: str | os.PathLike[str] | None = None) -> Any:
    """The fusion of ``opbridge.onnx.export(fuse=True)``: an onnx ModelProto with torch's GroupNorm
    forms (decomposition, GroupNormalization-21) made ``ai.opbridge::GroupNorm`` and SiLU fused
    into it. Tensors stay where they are (inline, or external references beside ``path``, where
    the model is written, which the rules read small constants from: through the checked reader,
    onnx/_reader.py)."""
    import onnx_ir as ir

    if path is not None:
        from . import _reader

        model = _reader.to_ir(proto, path, pin=False)
    else:
        model = ir.serde.deserialize_model(proto)
    result = rewrite_model(model, silu=silu, sources=EXPORT_SOURCES)
    if not result.changed:
        return proto
    return ir.serde.serialize_model(model)
