"""``opbridge optimize IN.onnx OUT.onnx``: GroupNorm in models exported by anyone, as one
``ai.opbridge::GroupNorm`` node (with SiLU fused where it follows).

Rewritten (docs/optimize.md has the exact conditions of each rule):

* the GroupNorm decomposition of torch's exporters (TorchScript, and dynamo below opset 21):
  Reshape(X, [0, G, -1]) -> InstanceNormalization(ones, zeros) -> Reshape(Shape(X)) -> Mul -> Add;
* ``GroupNormalization``-18 (per-group scale and bias, converted to per-channel ones) and -21;
* ``com.microsoft::GroupNorm`` (NHWC by default, with an ``activation``): channels-last inputs get
  Transposes around our node, and a Transpose pair that cancels out is dropped;
* then GroupNorm followed by SiLU (``Mul(y, Sigmoid(y))``, ``Swish(alpha=1)``,
  ``com.microsoft::QuickGelu(alpha=1)``, ``y / (1 + Exp(-y))``) becomes ``GroupNorm(activation="silu")``
  when nothing else reads the GroupNorm's output.

Every rule is an onnxscript pattern-rewriter rule (onnxscript.rewriter.pattern): the matcher
guarantees that the replaced nodes' intermediate values have no reader outside the pattern.

The command checks the rewritten model against the original on random inputs in ONNX Runtime
and writes nothing when they disagree. Needs onnx, onnxscript and onnxruntime; not torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gc
import math
import os
import secrets
import shutil
import sys
import tempfile
from typing import Any, Callable, Iterator, Mapping, Sequence, TextIO

import numpy as np

from ._library import DOMAIN

# The ONNX op type of opbridge's GroupNorm (opbridge.onnx.group_norm.OP_TYPE; repeated here because
# that module's package needs the export machinery, and this module must stay light).
OP_TYPE = "GroupNorm"
SILU = "silu"
# ai.opbridge version that introduced GroupNorm's `activation` attribute. A model with a node that
# sets it imports the domain at least at this version.
ACTIVATION_DOMAIN_VERSION = 2
MS_DOMAIN = "com.microsoft"

# Largest tensor (bytes) a protobuf message can hold in one piece; past this total the model must
# keep its tensors in an external data file.
PROTOBUF_LIMIT = 2**31 - 1
# With a file target, opbridge.onnx.export and optimize keep a model's tensors in an external data
# file past this many bytes (below it, in the model file, as before). Writing one file needs the
# serialized model in memory twice (the ModelProto, then its bytes); past 256 MiB that would exceed
# export's budget of one model size + 0.5 GB over torch.onnx.export's own peak, while external data is
# written one tensor at a time. It is also where ORT starts to gain from memory-mapping the tensors.
AUTO_EXTERNAL_BYTES = 256 << 20
# Tensors larger than this go to the external data file when one is written (onnx's own default).
EXTERNAL_THRESHOLD = 1024
# Offsets of large external tensors are aligned so that ONNX Runtime can memory-map them instead
# of copying (64 KiB: the allocation granularity it checks on every platform).
EXTERNAL_ALIGNMENT = 65536

# Agreement required between the rewritten and the original model, per output:
#   max |rewritten - original| <= tol * max(1, max |original|)
# GroupNorm is reassociated (statistics in another order, scale and bias folded), so the outputs
# differ by rounding; a normalized max error keeps the test meaningful for outputs of any scale.
TOLERANCE = {"float64": 1e-3, "float32": 1e-3, "float16": 2e-2, "bfloat16": 5e-2}
DEFAULT_RUNS = 2

_NOT_REWRITTEN = "not rewritten"


# --------------------------------------------------------------------------------------------
# Helpers over onnx_ir values
# --------------------------------------------------------------------------------------------


def _ir():
    import onnx_ir as ir

    return ir


def _float_types() -> set:
    ir = _ir()
    return {ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16}


def _const(value: Any, max_elements: int = 1 << 24) -> np.ndarray | None:
    """The constant behind ``value`` (initializer or Constant node), or None. Large constants are
    not read: the rules only need small vectors, and a large one is never a GroupNorm parameter."""
    if value is None:
        return None
    ir = _ir()
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None or tensor.size > max_elements:
        return None
    return np.asarray(tensor.numpy())


def _dims(value: Any) -> list[int | None] | None:
    """Static dims of ``value`` (None for symbolic ones), or None when its rank is unknown."""
    shape = value.shape if value is not None else None
    if shape is None:
        return None
    return [d if isinstance(d, int) else None for d in shape.dims]


def _node_label(node: Any) -> str:
    name = f" {node.name!r}" if node is not None and node.name else ""
    return f"{node.domain + '::' if node is not None and node.domain else ''}{node.op_type if node else '?'}{name}"


def _channel_param(value: Any, rank: int, channels: int) -> tuple[str, Any] | None:
    """Reads a Mul/Add operand of the decomposition as a per-channel vector of x (N, C, *).

    Returns ("const", float64 array (C,)), ("value", ir.Value to be reshaped to (C,)) or None when
    the operand may vary along another axis than the channels (then it is not GroupNorm's affine).
    The operand broadcasts right-aligned against x, so a (C,) vector would scale the LAST axis,
    not the channels: only (C, 1, ..., 1)-like shapes qualify."""
    arr = _const(value)
    dims = list(arr.shape) if arr is not None else _dims(value)
    if dims is None or len(dims) > rank or any(d is None for d in dims):
        return None
    full = [1] * (rank - len(dims)) + dims
    if any(d != 1 for i, d in enumerate(full) if i != 1) or full[1] not in (1, channels):
        return None
    if arr is not None:
        return "const", np.broadcast_to(arr.astype(np.float64).reshape(-1), (channels,)).copy()
    if full[1] != channels:  # a broadcast scalar that is not a constant: would need an Expand
        return None
    return "value", value


@dataclasses.dataclass
class _Plan:
    """What replaces a match: ai.opbridge::GroupNorm(x, scale, bias) with these attributes."""

    x: Any
    num_groups: int
    epsilon: float
    channels: int | None
    scale: Any  # float64 ndarray (C,), an ir.Value of C elements, or None (= ones)
    bias: Any
    activation: str = "none"
    channels_last_rank: int = 0  # > 0: x is (N, *, C) of this rank; transpose around the node


class _Skip(Exception):
    """A pattern matched structurally but cannot be rewritten; the message says why."""


# --------------------------------------------------------------------------------------------
# The rules
# --------------------------------------------------------------------------------------------


def _rules_module():
    from onnxscript.rewriter import pattern

    return pattern


class _Session:
    """State shared by the rules of one rewrite: unique initializer names and skip notes."""

    def __init__(self) -> None:
        self.skipped: dict[str, str] = {}
        self._names: set[str] = set()

    def note(self, node: Any, reason: str) -> None:
        self.skipped.setdefault(f"{_node_label(node)}: {reason}", "")

    def fresh_name(self, graph: Any, hint: str) -> str:
        taken = set(graph.initializers) if hasattr(graph, "initializers") else set()
        base = "".join(c if c.isalnum() or c in "._-" else "_" for c in hint) or "opbridge"
        name, i = base, 1
        while name in taken or name in self._names:
            name, i = f"{base}_{i}", i + 1
        self._names.add(name)
        return name


def _replacement(op: Any, v: Any) -> Any:
    """What a rule returns to replace its match by the existing value v. Returning v itself renames
    it to the replaced value's name (the rewriter keeps that name): fine for an intermediate value,
    not for a graph input, output or initializer, which get an Identity."""
    if v.producer() is None or v.is_graph_output() or v.is_initializer():
        return op.Identity(v)
    return v


def _make_rule_classes():
    """The rule classes (built on first use, so that importing this module stays cheap)."""
    ir = _ir()
    pattern = _rules_module()

    class _ToGroupNorm(pattern.RewriteRuleClassBase):
        """Shared rewrite: a _Plan -> (Transpose) GroupNorm (Transpose)."""

        def __init__(self, session: _Session, name: str) -> None:
            super().__init__(name=name)
            self.session = session
            self._plan: _Plan | None = None
            self._graph: Any = None

        def _fail(self, node: Any, reason: str, note: bool = True):
            if note:
                self.session.note(node, reason)
            return pattern.MatchResult().fail(reason)

        def _vector(self, op: Any, param: Any, plan: _Plan, fill: float, hint: str) -> Any:
            dtype = plan.x.dtype
            if param is None:
                if plan.channels is None:
                    return None
                param = np.full(plan.channels, fill)
            if isinstance(param, np.ndarray):
                arr = param.astype(dtype.numpy())
                name = self.session.fresh_name(self._graph, hint)
                return op.initializer(ir.tensor(arr, dtype=dtype, name=name), name=name)
            value = param
            if value.dtype is not None and value.dtype != dtype:
                value = op.Cast(value, to=dtype)
            if len(_dims(param) or [None, None]) != 1:
                value = op.Reshape(value, op.Constant(value_ints=[-1]))
            return value

        def _emit(self, op: Any, plan: _Plan, hint: str) -> Any:
            x = plan.x
            r = plan.channels_last_rank
            if r:
                # NHWC -> NCHW for our node, then back: the layout the original node had.
                x = op.Transpose(x, perm=[0, r - 1, *range(1, r - 1)])
            scale = self._vector(op, plan.scale, plan, 1.0, f"{hint}.scale")
            bias = self._vector(op, plan.bias, plan, 0.0, f"{hint}.bias")
            attrs: dict[str, Any] = {"num_groups": int(plan.num_groups), "epsilon": float(plan.epsilon)}
            if plan.activation != "none":  # emitted only when not the default (stays a version-1 node)
                attrs["activation"] = plan.activation
            y = op.GroupNorm(x, scale, bias, _domain=DOMAIN, **attrs)
            if r:
                y = op.Transpose(y, perm=[0, *range(2, r), 1])
            return y

    class Decomposition(_ToGroupNorm):
        """Reshape(X, [0, G, -1]) -> InstanceNormalization -> Reshape(Shape(X)) [-> Mul(w)] [-> Add(b)].

        restore=False: the same without the second Reshape, which the dynamo exporter's optimizer
        removes where it does nothing: X of rank 3 with one channel per group (G = C), where the
        grouping Reshape gives X's own shape (wav2vec2's GroupNorm(512, 512) on (N, 512, L))."""

        def __init__(self, session: _Session, name: str, mul: bool, add: bool, restore: bool = True) -> None:
            super().__init__(session, name)
            self.mul, self.add, self.restore = mul, add, restore

        def pattern(self, op, x, grouped_shape, in_scale, in_bias, out_shape, weight, bias):
            grouped = op.Reshape(x, grouped_shape, _outputs=["grouped"])
            normed = op.InstanceNormalization(grouped, in_scale, in_bias, _outputs=["normed"])
            y = op.Reshape(normed, out_shape, _outputs=["restored"]) if self.restore else normed
            if self.mul:
                y = op.Mul(y, weight)
            if self.add:
                y = op.Add(y, bias)
            return y

        def check(self, context, x, grouped_shape, in_scale, in_bias, grouped, normed, out_shape=None,
                  restored=None, weight=None, bias=None, **_):
            self._graph = context.graph_or_function
            node = normed.producer()
            try:
                self._plan = self._analyze(x, grouped_shape, in_scale, in_bias, out_shape, grouped, normed,
                                           restored, weight, bias)
            except _Skip as e:
                # Only the core's failures are worth a note: a failing Mul/Add is left in place by
                # the next rule, which rewrites the core alone. Without the second Reshape, a
                # Reshape + InstanceNormalization is most often not a GroupNorm at all: no note.
                return self._fail(node, str(e), note=self.restore and not (self.mul or self.add))
            return pattern.MatchResult()

        def _analyze(self, x, grouped_shape, in_scale, in_bias, out_shape, grouped, normed, restored, weight,
                     bias) -> _Plan:
            if x.dtype not in _float_types():
                raise _Skip(f"{_NOT_REWRITTEN}: X has type {x.dtype}, GroupNorm takes float types")
            dims = _dims(x)
            if dims is None or len(dims) < 2:
                raise _Skip(f"{_NOT_REWRITTEN}: the rank of X is unknown or < 2")
            rank, channels = len(dims), dims[1]
            if channels is None:
                raise _Skip(f"{_NOT_REWRITTEN}: the channel count X.shape[1] is not static")
            s, t = _const(in_scale), _const(in_bias)
            if s is None or t is None or s.ndim != 1 or t.shape != s.shape:
                raise _Skip(f"{_NOT_REWRITTEN}: InstanceNormalization's scale and bias are not constant vectors")
            groups = int(s.shape[0])
            if groups <= 0 or channels % groups:
                raise _Skip(f"{_NOT_REWRITTEN}: {groups} groups do not divide the {channels} channels")
            reshape1 = grouped.producer()
            allowzero = reshape1.attributes.get_int("allowzero", 0)
            gs = _const(grouped_shape)
            if gs is None or gs.ndim != 1 or gs.shape[0] != 3 or not np.issubdtype(gs.dtype, np.integer):
                raise _Skip(f"{_NOT_REWRITTEN}: the grouping Reshape's shape is not a constant [N, G, -1]")
            n0, g, rest = (int(v) for v in gs)
            spatial = [d for d in dims[2:]]
            per_group = (channels // groups) * math.prod(spatial) if None not in spatial else None
            if not ((n0 == 0 and not allowzero) or (n0 > 0 and n0 == dims[0])) or g != groups or not (
                    rest == -1 or (per_group is not None and rest == per_group)):
                raise _Skip(f"{_NOT_REWRITTEN}: the grouping Reshape's shape {gs.tolist()} is not "
                            f"[0, {groups}, -1] (one group per {channels // groups} channels)")
            if not self.restore:
                if rank != 3 or groups != channels:
                    raise _Skip(f"{_NOT_REWRITTEN}: without a Reshape after InstanceNormalization, X must be "
                                "of rank 3 with one channel per group")
            elif not self._restores(out_shape, restored, x, dims):
                raise _Skip(f"{_NOT_REWRITTEN}: the second Reshape does not restore X's shape")
            eps = normed.producer().attributes.get_float("epsilon", 1e-5)

            w = _channel_param(weight, rank, channels) if self.mul else None
            b = _channel_param(bias, rank, channels) if self.add else None
            if (self.mul and w is None) or (self.add and b is None):
                raise _Skip(f"{_NOT_REWRITTEN}: the Mul/Add after it are not per-channel")
            trivial = bool(np.all(s == 1) and np.all(t == 0))
            scale = None if w is None else w[1]
            shift = None if b is None else b[1]
            if not trivial:
                # Per-group scale s and shift t inside, per-channel w and b outside:
                # w * (s * xhat + t) + b = (w * s) * xhat + (w * t + b).
                if (w is not None and w[0] != "const") or (b is not None and b[0] != "const"):
                    raise _Skip(f"{_NOT_REWRITTEN}: InstanceNormalization has a scale/bias other than 1/0 "
                                "and the Mul/Add after it are not constants")
                rep = channels // groups
                s_c = np.repeat(s.astype(np.float64), rep)
                t_c = np.repeat(t.astype(np.float64), rep)
                wv = np.ones(channels) if w is None else w[1]
                bv = np.zeros(channels) if b is None else b[1]
                scale, shift = wv * s_c, wv * t_c + bv
            return _Plan(x=x, num_groups=groups, epsilon=eps, channels=channels, scale=scale, bias=shift)

        @staticmethod
        def _restores(out_shape, restored, x, dims) -> bool:
            """Whether Reshape(normed, out_shape) gives X's shape: Shape(X), or a constant equal to
            X's static shape (0 copies the batch dim)."""
            producer = out_shape.producer()
            if producer is not None and producer.op_type == "Shape" and producer.domain in ("", "ai.onnx"):
                start = producer.attributes.get_int("start", 0)
                end = producer.attributes.get_int("end", None)
                return producer.inputs[0] is x and start == 0 and (end is None or end >= len(dims))
            v = _const(out_shape)
            if v is None or v.ndim != 1 or v.shape[0] != len(dims):
                return False
            allowzero = restored.producer().attributes.get_int("allowzero", 0)
            unknown = 0
            for i, (want, have) in enumerate(zip(v.tolist(), dims)):
                if want == -1:
                    unknown += 1
                elif not (want == have or (i == 0 and want == 0 and not allowzero)):
                    return False
            return unknown == 0 or (unknown == 1 and None not in dims[1:])

        def rewrite(self, op, x, normed=None, restored=None, **_):
            return self._emit(op, self._plan, (restored if self.restore else normed).name or "group_norm")

    class GroupNormalization(_ToGroupNorm):
        """GroupNormalization-18 (per-group scale/bias) or -21 (per-channel)."""

        def __init__(self, session: _Session, name: str, per_channel: bool) -> None:
            super().__init__(session, name)
            self.per_channel = per_channel

        def pattern(self, op, x, scale, bias):
            return op.GroupNormalization(x, scale, bias, _outputs=["y"])

        def check(self, context, x, scale, bias, y, **_):
            self._graph = context.graph_or_function
            node = y.producer()
            imports = context.graph_or_function.opset_imports
            version = imports.get("", imports.get("ai.onnx", 0))
            if (version >= 21) != self.per_channel:
                return self._fail(node, "other version", note=False)
            groups = node.attributes.get_int("num_groups", None)
            eps = node.attributes.get_float("epsilon", 1e-5)
            if x.dtype not in _float_types() or groups is None or groups <= 0:
                return self._fail(node, f"{_NOT_REWRITTEN}: not a float input or no valid num_groups")
            dims = _dims(x)
            channels = dims[1] if dims is not None and len(dims) >= 2 else None
            if self.per_channel:
                self._plan = _Plan(x=x, num_groups=groups, epsilon=eps, channels=channels, scale=scale, bias=bias)
                return pattern.MatchResult()
            # GroupNormalization-18: scale and bias have one value per GROUP; ours per channel.
            if channels is None:
                return self._fail(node, f"{_NOT_REWRITTEN}: GroupNormalization-18 needs a static channel count "
                                        "X.shape[1] to expand its per-group scale/bias to channels")
            s, t = _const(scale), _const(bias)
            if s is None or t is None:
                return self._fail(node, f"{_NOT_REWRITTEN}: GroupNormalization-18's scale/bias are not constants "
                                        "(they are per group; only constants are expanded to per-channel ones)")
            if s.size != groups or t.size != groups or channels % groups:
                return self._fail(node, f"{_NOT_REWRITTEN}: scale/bias do not have num_groups = {groups} "
                                        f"elements, or {groups} does not divide C = {channels}")
            rep = channels // groups
            self._plan = _Plan(x=x, num_groups=groups, epsilon=eps, channels=channels,
                               scale=np.repeat(s.astype(np.float64).reshape(-1), rep),
                               bias=np.repeat(t.astype(np.float64).reshape(-1), rep))
            return pattern.MatchResult()

        def rewrite(self, op, x, y=None, **_):
            return self._emit(op, self._plan, y.name or "group_norm")

    class MicrosoftGroupNorm(_ToGroupNorm):
        """com.microsoft::GroupNorm(X, gamma, beta; activation, channels_last=1, epsilon, groups)."""

        def pattern(self, op, x, gamma, beta):
            return op.GroupNorm(x, gamma, beta, _domain=MS_DOMAIN, _outputs=["y"])

        def check(self, context, x, gamma, beta, y, **_):
            self._graph = context.graph_or_function
            node = y.producer()
            a = node.attributes
            activation = a.get_int("activation", None)
            groups = a.get_int("groups", None)
            channels_last = a.get_int("channels_last", 1)
            if activation not in (0, 1):
                return self._fail(node, f"{_NOT_REWRITTEN}: activation = {activation} (known: 0 none, 1 SiLU)")
            if groups is None or groups <= 0:
                return self._fail(node, f"{_NOT_REWRITTEN}: no valid 'groups' attribute")
            if x.dtype not in _float_types():
                return self._fail(node, f"{_NOT_REWRITTEN}: X is not a float tensor")
            dims = _dims(x)
            rank = 0
            if channels_last:
                if dims is None or len(dims) < 3:
                    return self._fail(node, f"{_NOT_REWRITTEN}: channels_last input of unknown rank")
                rank = len(dims)
            channels = (dims[-1] if channels_last else dims[1]) if dims else None
            self._plan = _Plan(x=x, num_groups=groups, epsilon=a.get_float("epsilon", 1e-5), channels=channels,
                               scale=gamma, bias=beta, activation=SILU if activation == 1 else "none",
                               channels_last_rank=rank)
            return pattern.MatchResult()

        def rewrite(self, op, x, y=None, **_):
            plan = self._plan
            # gamma/beta may be float32 for a float16 X (type M): constants are converted here,
            # other values get a Cast in _vector.
            plan.scale = _as_const_or_value(plan.scale)
            plan.bias = _as_const_or_value(plan.bias)
            return self._emit(op, plan, y.name or "group_norm")

    class SameTypeCastLike(pattern.RewriteRuleClassBase):
        """CastLike(v, like) where v already has like's type, and like is the output of a GroupNorm
        decomposition (a Reshape of an InstanceNormalization) or of the Mul after it: the dynamo
        exporter writes Mul(restored, CastLike(w, restored)) and Add(·, CastLike(b, ·)) for
        bfloat16, and those second readers kept the Mul and Add (and a following SiLU) out of the
        rewrite."""

        def __init__(self, session: _Session) -> None:
            super().__init__(name="opbridge.same_type_cast_like")
            self.session = session
            self._graph: Any = None

        def pattern(self, op, v, like):
            return op.CastLike(v, like)

        @staticmethod
        def _restored(value) -> bool:
            """Whether value is Reshape(InstanceNormalization(...), ...)."""
            node = value.producer()
            if node is None or node.op_type != "Reshape" or node.inputs[0] is None:
                return False
            source = node.inputs[0].producer()
            return source is not None and source.op_type == "InstanceNormalization"

        def check(self, context, v, like, **_):
            self._graph = context.graph_or_function
            node = like.producer()
            after_mul = node is not None and node.op_type == "Mul" and any(
                i is not None and self._restored(i) for i in node.inputs)
            if not (self._restored(like) or after_mul):
                return pattern.MatchResult().fail("not after a GroupNorm decomposition")
            if v.dtype is None or v.dtype != like.dtype:
                return pattern.MatchResult().fail("a real cast")
            return pattern.MatchResult()

        def rewrite(self, op, v, **_):
            # A constant (the exporters' weight and bias: C elements) is copied into a new
            # initializer; anything else is replaced as _replacement says.
            arr = _const(v)
            if arr is not None and (v.is_initializer() or v.producer() is not None):
                name = self.session.fresh_name(self._graph, v.name or "cast_like")
                return op.initializer(ir.tensor(arr, dtype=v.dtype, name=name), name=name)
            return _replacement(op, v)

    class TransposePair(pattern.RewriteRuleClassBase):
        """Transpose(Transpose(v, p1), p2) with p1 then p2 the identity -> v, where one of the two
        was inserted around a channels-last GroupNorm."""

        def __init__(self, tag: str) -> None:
            super().__init__(name="opbridge.cancel_transposes")
            self.tag = tag

        def pattern(self, op, v):
            return op.Transpose(op.Transpose(v, _outputs=["t1"]), _outputs=["t2"])

        def check(self, context, v, t1, t2, **_):
            n1, n2 = t1.producer(), t2.producer()
            from onnxscript.rewriter import RULE_NAME_TAG

            if not any(self.tag in (n.metadata_props.get(RULE_NAME_TAG) or "") for n in (n1, n2)):
                return pattern.MatchResult().fail("neither Transpose was inserted by opbridge")
            p1, p2 = n1.attributes.get_ints("perm", None), n2.attributes.get_ints("perm", None)
            if p1 is None or p2 is None or len(p1) != len(p2) or any(p1[p2[i]] != i for i in range(len(p2))):
                return pattern.MatchResult().fail("not inverse permutations")
            return pattern.MatchResult()

        def rewrite(self, op, v, t2=None, **_):
            return _replacement(op, v)

    class FuseSilu(pattern.RewriteRuleClassBase):
        """ai.opbridge::GroupNorm followed by a SiLU form -> GroupNorm(activation="silu")."""

        def __init__(self, form: str) -> None:
            super().__init__(name=f"opbridge.fuse_silu.{form}")
            self.form = form

        def pattern(self, op, x, one):
            y = op.GroupNorm(x, _domain=DOMAIN, _allow_other_inputs=True, _outputs=["gn"])
            if self.form == "sigmoid_mul":
                return op.Mul(y, op.Sigmoid(y))
            if self.form == "swish":
                return op.Swish(y, _outputs=["act"])
            if self.form == "quick_gelu":
                return op.QuickGelu(y, _domain=MS_DOMAIN, _outputs=["act"])
            return op.Div(y, op.Add(op.Exp(op.Neg(y)), one))  # y / (1 + exp(-y))

        def check(self, context, gn, one=None, act=None, **_):
            node = gn.producer()
            if node.attributes.get_string("activation", "none") != "none":
                return pattern.MatchResult().fail("GroupNorm already has an activation")
            if self.form in ("swish", "quick_gelu"):
                alpha = act.producer().attributes.get_float("alpha", 1.0 if self.form == "swish" else 1.702)
                if alpha != 1.0:
                    return pattern.MatchResult().fail(f"alpha = {alpha}, not SiLU")
            if self.form == "div":
                c = _const(one)
                if c is None or c.size != 1 or float(c.reshape(-1)[0]) != 1.0:
                    return pattern.MatchResult().fail("not 1 + exp(-y)")
            return pattern.MatchResult()

        def rewrite(self, op, gn=None, **_):
            node = gn.producer()
            attrs = {k: v for k, v in node.attributes.items() if k != "activation"}
            attrs["activation"] = SILU
            return op.GroupNorm(*node.inputs, _domain=DOMAIN, **attrs)

    return Decomposition, GroupNormalization, MicrosoftGroupNorm, TransposePair, FuseSilu, SameTypeCastLike


def _as_const_or_value(value: Any) -> Any:
    """A float64 array when ``value`` is a constant vector, else the value itself."""
    arr = _const(value)
    return arr.astype(np.float64).reshape(-1) if arr is not None else value


# Labels of what a rewrite did, in report order.
LABEL_DECOMPOSITION = "GroupNorm decomposition (Reshape, InstanceNormalization, Reshape, Mul, Add)"
LABEL_DECOMPOSITION_3D = "GroupNorm decomposition, 3-D X, G = C (Reshape, InstanceNormalization, Mul, Add)"
LABEL_CAST_LIKE = "CastLike to the type it already has, after a GroupNorm decomposition: removed"
LABEL_GN18 = "GroupNormalization-18 (per-group scale/bias made per-channel)"
LABEL_GN21 = "GroupNormalization-21"
LABEL_MS = "com.microsoft::GroupNorm"
LABEL_TRANSPOSES = "Transpose pairs around channels-last GroupNorms removed"
LABEL_SILU = 'GroupNorm + SiLU fused into GroupNorm(activation="silu")'

# What each caller may rewrite: optimize takes every source; export only what torch emits.
SOURCES = ("decomposition", "gn18", "gn21", "com.microsoft")
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

    pattern = _rules_module()
    unknown = set(sources) - set(SOURCES)
    if unknown:
        raise ValueError(f"sources: unknown {sorted(unknown)}; expected a subset of {SOURCES}")
    Decomposition, GroupNormalization, MicrosoftGroupNorm, TransposePair, FuseSilu, SameTypeCastLike = (
        _make_rule_classes())
    session = _Session()
    infer_shapes_ir(model)
    ms_rule_name = "opbridge.com_microsoft_group_norm"

    # (label, rules, what to run after them when they changed something)
    stages: list[tuple[str, list, Callable[[Any], Any] | None]] = []
    if "decomposition" in sources:
        stages.append((LABEL_CAST_LIKE, [SameTypeCastLike.rule(session)], None))
        # Longest form first: each later rule would otherwise match a prefix of a longer one.
        for restore in (True, False):
            for mul, add in ((True, True), (True, False), (False, True), (False, False)):
                name = f"opbridge.decomposition.{int(mul)}{int(add)}{'' if restore else '.3d'}"
                stages.append((LABEL_DECOMPOSITION if restore else LABEL_DECOMPOSITION_3D,
                               [Decomposition.rule(session, name, mul, add, restore)], None))
    if "gn21" in sources:
        stages.append((LABEL_GN21, [GroupNormalization.rule(session, "opbridge.group_normalization_21", True)], None))
    if "gn18" in sources:
        stages.append((LABEL_GN18, [GroupNormalization.rule(session, "opbridge.group_normalization_18", False)], None))
    if "com.microsoft" in sources:
        stages.append((LABEL_MS, [MicrosoftGroupNorm.rule(session, ms_rule_name)], None))
        # A cancelled pair on a graph input leaves an Identity (see TransposePair.rewrite).
        stages.append((LABEL_TRANSPOSES, [TransposePair.rule(ms_rule_name)], passes.IdentityEliminationPass()))
    if silu:
        forms = ("sigmoid_mul", "swish", "quick_gelu", "div")
        stages.append((LABEL_SILU, [FuseSilu.rule(form) for form in forms], None))

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
        _finish(model)
    return RewriteResult(counts=counts, skipped=list(session.skipped))


def infer_shapes_ir(model: Any) -> None:
    """Types and shapes of the intermediate values, which the rules check and which some exporters
    (TorchScript) do not record. onnx's inference, with opbridge's schemas registered so that it
    sees through existing ai.opbridge nodes; large tensors stay out of it. Best effort: a model
    onnx cannot infer keeps what it has (and the rules skip what they cannot verify)."""
    import onnx_ir.passes.common as passes

    from .onnx import register_schemas

    register_schemas()
    passes.ShapeInferencePass(check_type=False, strict_mode=False, data_prop=True)(model)


def _finish(model: Any) -> None:
    """Domain versions and bookkeeping after a rewrite."""
    from onnxscript.rewriter import RULE_NAME_TAG

    uses_activation = False
    for graph in (model.graph, *model.graph.subgraphs()):
        for node in graph:
            node.metadata_props.pop(RULE_NAME_TAG, None)
            if node.domain == DOMAIN and node.op_type == OP_TYPE and "activation" in node.attributes:
                uses_activation = True
    for fn in model.functions.values():
        for node in fn:
            node.metadata_props.pop(RULE_NAME_TAG, None)
    imports = model.graph.opset_imports
    if DOMAIN in imports and uses_activation:
        imports[DOMAIN] = max(int(imports[DOMAIN]), ACTIVATION_DOMAIN_VERSION)


def fuse_exported(proto: Any, *, silu: bool = True, base_dir: str | os.PathLike | None = None) -> Any:
    """The fusion of ``opbridge.onnx.export(fuse=True)``: an onnx ModelProto with torch's GroupNorm
    forms (decomposition, GroupNormalization-21) made ``ai.opbridge::GroupNorm`` and SiLU fused
    into it. Tensors stay where they are (inline, or external references into ``base_dir``, the
    folder of the model file, which the rules read small constants from)."""
    ir = _ir()
    model = ir.serde.deserialize_model(proto)
    if base_dir is not None:
        ir.external_data.set_base_dir(model.graph, os.fspath(base_dir))
    result = rewrite_model(model, silu=silu, sources=EXPORT_SOURCES)
    if not result.changed:
        return proto
    return ir.serde.serialize_model(model)


# --------------------------------------------------------------------------------------------
# References and comparison
# --------------------------------------------------------------------------------------------


def ms_group_norm_reference(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, *, groups: int, epsilon: float = 1e-5,
                            activation: int = 0, channels_last: int = 1) -> np.ndarray:
    """com.microsoft::GroupNorm as ONNX Runtime documents it, in float64 (result in X's dtype):
    y = gamma * (x - mean) / sqrt(var + epsilon) + beta per group of C / groups channels, X NHWC
    when channels_last = 1 (else NCHW), then SiLU when activation = 1."""
    x64 = np.asarray(x, dtype=np.float64)
    if channels_last:
        x64 = np.moveaxis(x64, -1, 1)
    n, c = x64.shape[:2]
    g = x64.reshape(n, groups, -1)
    mean = g.mean(axis=2, keepdims=True)
    var = ((g - mean) ** 2).mean(axis=2, keepdims=True)
    y = ((g - mean) / np.sqrt(var + epsilon)).reshape(x64.shape)
    bshape = (1, c) + (1,) * (x64.ndim - 2)
    y = y * np.asarray(gamma, np.float64).reshape(bshape) + np.asarray(beta, np.float64).reshape(bshape)
    if activation == 1:
        y = y / (1.0 + np.exp(-y))
    if channels_last:
        y = np.moveaxis(y, 1, -1)
    return y.astype(np.asarray(x).dtype)


def _reference_outputs(path: str, feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> list[np.ndarray]:
    """Runs the model at ``path`` with onnx's reference evaluator, com.microsoft::GroupNorm from
    ms_group_norm_reference (ONNX Runtime has no CPU kernel for it)."""
    import onnx
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.op_run import OpRun

    class GroupNorm(OpRun):
        op_domain = MS_DOMAIN
        # Without this, OpRun looks schemas up by op name across domains and may find
        # ai.opbridge::GroupNorm's (registered with onnx by opbridge.onnx).
        op_schema = None

        def _run(self, X, gamma, beta, activation=None, channels_last=None, epsilon=None, groups=None):
            return (ms_group_norm_reference(X, gamma, beta, groups=int(groups),
                                            epsilon=1e-5 if epsilon is None else float(epsilon),
                                            activation=int(activation or 0),
                                            channels_last=1 if channels_last is None else int(channels_last)),)

    evaluator = ReferenceEvaluator(onnx.load(path), new_ops=[GroupNorm])
    return [np.asarray(v) for v in evaluator.run(list(names), dict(feeds))]


def tolerance_for(dtype: Any) -> float | None:
    """The normalized max-error tolerance for outputs of this numpy dtype (None: must be equal)."""
    return TOLERANCE.get(np.dtype(dtype).name)


def compare(got: np.ndarray, ref: np.ndarray, tol: float | None) -> tuple[float, str]:
    """How far ``got`` is from ``ref``: (error / allowed error, one-line summary). A ratio <= 1
    agrees (see TOLERANCE); inf when shapes, non-finite values or exact (integer) values differ."""
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape:
        return math.inf, f"shape {list(got.shape)} instead of {list(ref.shape)}"
    if tol is None or not np.issubdtype(ref.dtype, np.floating):
        bad = int(np.count_nonzero(got != ref))
        return (0.0, "equal") if bad == 0 else (math.inf, f"{bad} elements differ")
    g, r = got.astype(np.float64), ref.astype(np.float64)
    finite = np.isfinite(r)
    # Non-finite reference values must be reproduced exactly (inf sign, NaN); NaN == NaN here.
    same_nonfinite = np.all((np.isnan(g) & np.isnan(r)) | (g == r) | finite)
    if not same_nonfinite or not np.all(np.isfinite(g[finite])):
        return math.inf, "non-finite values differ"
    if not finite.any():
        return 0.0, "max error 0"
    err = float(np.max(np.abs(g[finite] - r[finite])))
    limit = tol * max(1.0, float(np.max(np.abs(r[finite]))))
    return err / limit, f"max error {err:.3g} (allowed {limit:.3g})"


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


class UnreadableModel(Exception):
    """The input cannot be read as an ONNX model; the message names the file and why."""


class WriteError(OSError):
    """A file could not be written (a full disk, no permission); the message names it and why."""


@contextlib.contextmanager
def writing(path: str) -> Iterator[None]:
    """OSErrors inside the block become a WriteError naming ``path``."""
    try:
        yield
    except WriteError:
        raise
    except OSError as e:
        reason = e.strerror or str(e)
        raise WriteError(e.errno, f"cannot write {path}: {reason}") from e


@contextlib.contextmanager
def write_file(path: str) -> Iterator[str]:
    """Yields a temporary name beside ``path`` to write to; renamed to ``path`` when the block
    completes, removed when it fails (an OSError then becomes a WriteError naming ``path``)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    with writing(path):
        os.makedirs(folder, exist_ok=True)
        # A name only (the writer creates the file, with the usual permissions; mkstemp's are 0600).
        tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            yield tmp
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise


def load(path: str) -> Any:
    """The model at ``path`` as an onnx_ir Model; external data stays on disk (memory-mapped)."""
    ir = _ir()
    return ir.load(path)


def _external_entries(proto: Any) -> Iterator[tuple[Any, dict[str, str]]]:
    """(TensorProto, its external_data entries) for every tensor of the model kept in external data."""
    import onnx

    from .onnx._external_data import _tensors

    for t in _tensors(proto.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            yield t, {e.key: e.value for e in t.external_data}


@dataclasses.dataclass
class ModelFiles:
    """What a model's files hold, read from the graph alone (no tensor is loaded)."""

    path: str
    file_bytes: int  # the model file itself
    inline_bytes: int  # tensor bytes stored in the model file
    external_bytes: int  # tensor bytes stored in external data files
    data_files: list[str]

    @property
    def tensor_bytes(self) -> int:
        return self.inline_bytes + self.external_bytes

    @property
    def external(self) -> bool:
        return bool(self.data_files)


def model_files(path: str) -> ModelFiles:
    """Reads the graph of the model at ``path`` (not its external data) and checks every external
    data reference: the file exists beside the model and holds offset + length bytes.
    UnreadableModel naming the file and the reason otherwise."""
    import onnx
    from google.protobuf.message import DecodeError

    path = os.fspath(path)
    try:
        proto = onnx.load(path, load_external_data=False)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise UnreadableModel(f"cannot read {path}: it is not an ONNX model (protobuf cannot parse it: {e})") from e
    except OSError as e:
        raise UnreadableModel(f"cannot read {path}: {e.strerror or e}") from e
    if not proto.HasField("graph") or proto.ir_version <= 0:
        raise UnreadableModel(f"cannot read {path}: it is not an ONNX model (it parses as protobuf but has no "
                              f"{'graph' if not proto.HasField('graph') else 'IR version'})")
    folder = os.path.dirname(os.path.abspath(path))
    files: dict[str, int] = {}
    external = 0
    for t, info in _external_entries(proto):
        location = info.get("location", "")
        if not location or os.path.isabs(location) or ".." in location.replace("\\", "/").split("/"):
            raise UnreadableModel(f"{path}: tensor {t.name!r} refers to external data at {location!r}, which is not a "
                                  "file in the model's folder")
        data = os.path.join(folder, location)
        if data not in files:
            if not os.path.isfile(data):
                raise UnreadableModel(f"{path}: tensor {t.name!r}: its external data file {data} does not exist")
            files[data] = os.path.getsize(data)
        offset = int(info.get("offset", 0) or 0)
        length = int(info["length"]) if info.get("length") else files[data] - offset
        if offset + length > files[data]:
            raise UnreadableModel(f"{path}: tensor {t.name!r}: its external data file {data} is truncated "
                                  f"({files[data]} bytes, the tensor needs bytes {offset} to {offset + length})")
        external += length
    file_bytes = os.path.getsize(path)
    # Stored inline: what the file holds beyond the graph, which the tensors dwarf when it matters.
    inline = sum(t.ByteSize() for t in _inline_tensors(proto))
    return ModelFiles(path=path, file_bytes=file_bytes, inline_bytes=inline, external_bytes=external,
                      data_files=sorted(files))


def _inline_tensors(proto: Any) -> Iterator[Any]:
    import onnx

    from .onnx._external_data import _tensors

    return (t for t in _tensors(proto.graph) if t.data_location != onnx.TensorProto.EXTERNAL)


def check_external_files(model: Any) -> None:
    """FileNotFoundError/ValueError naming the first external tensor whose data is not there."""
    ir = _ir()
    for graph in (model.graph, *model.graph.subgraphs()):
        for value in graph.initializers.values():
            t = value.const_value
            if isinstance(t, ir.ExternalTensor):
                path = t.path
                if not os.path.isfile(path):
                    raise FileNotFoundError(f"tensor {value.name!r}: its external data file {path} does not exist")
                if t.offset is not None and t.length is not None and os.path.getsize(path) < t.offset + t.length:
                    raise ValueError(f"tensor {value.name!r}: {path} is shorter than offset + length "
                                     f"({t.offset} + {t.length})")


def uses_external_data(model: Any) -> bool:
    ir = _ir()
    for graph in (model.graph, *model.graph.subgraphs()):
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                return True
    return False


def tensor_bytes(model: Any) -> int:
    """Bytes of all initializers (what must fit in one protobuf message unless kept external)."""
    total = 0
    for graph in (model.graph, *model.graph.subgraphs()):
        for value in graph.initializers.values():
            t = value.const_value
            if t is not None:
                total += int(t.nbytes)
    return total


def data_file_name(path: str) -> str:
    """Name of the external data file written next to the model at ``path``."""
    return os.path.basename(os.fspath(path)) + ".data"


def save(model: Any, path: str, external: bool) -> None:
    """Writes ``model`` to ``path``; with ``external``, tensors > 1 KiB go to data_file_name(path)
    in the same folder (large ones 64 KiB-aligned so that ONNX Runtime can memory-map them),
    written one tensor at a time from where they are (the input's data file, memory-mapped)."""
    ir = _ir()
    path = os.fspath(path)
    if external:
        ir.save(model, path, external_data=data_file_name(path), size_threshold_bytes=EXTERNAL_THRESHOLD,
                alignment=EXTERNAL_ALIGNMENT)
    else:
        ir.save(model, path)


# --------------------------------------------------------------------------------------------
# Memory: what optimize needs, known before loading the model
# --------------------------------------------------------------------------------------------

# Peak RSS of `opbridge optimize`, measured in child processes (ru_maxrss) on float32 models of
# 0.5-4 GB (docs/optimize.md, "Memory and time"); G = the model's tensor bytes:
# * the interpreter with numpy, onnx, onnx_ir, onnxscript and onnxruntime: about 0.2 GB (BASE_BYTES
#   leaves room);
# * an input with its tensors in the model file is read whole: the file's bytes and the parsed
#   model, 2 G for a moment; one with external data is memory-mapped (pages read when used);
# * writing: external data is copied one tensor at a time; one file (at most AUTO_EXTERNAL_BYTES)
#   is serialized (a copy of the model, then its bytes) while the input is still held;
# * the check runs the original, then the rewritten model in ONNX Runtime, one session at a time:
#   about G over external data (the mapped weights), 2 G over a model file with its tensors inline
#   (the file's bytes and the weights). Each factor below is the measured one rounded up by 10%.
BASE_BYTES = 300 << 20
SESSION_FACTOR_EXTERNAL = 1.1
INLINE_FACTOR = 2.2
# Reading a model file of this size or less to learn its tensor sizes costs nothing worth
# counting; a larger file is mostly tensors, and its size is their size.
GRAPH_ONLY_BYTES = 64 << 20


def estimated_peak(tensor_bytes: int, inline_input: bool, external_output: bool) -> int:
    """Peak RSS optimize needs for a model of ``tensor_bytes`` (see above)."""
    g = tensor_bytes
    if not inline_input:
        stages = [SESSION_FACTOR_EXTERNAL * g, 0 if external_output else INLINE_FACTOR * g]
    else:
        stages = [INLINE_FACTOR * g, g + (0 if external_output else INLINE_FACTOR * g)]
    return BASE_BYTES + int(max(stages))


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo (bytes), or None where there is no such file."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
               "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
               "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_size(text: str) -> int:
    """'8G' / '8GiB' (2**30), '8GB' (10**9), '512M', '1.5g', '1000000' -> bytes; ValueError else."""
    t = str(text).strip().lower().replace(" ", "")
    number = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in _SIZE_UNITS or not (value > 0) or not math.isfinite(value):
        raise ValueError(f"--max-memory expects a size such as 8G, 8GiB, 8GB or 512M, got {text!r}")
    return int(value * _SIZE_UNITS[unit])


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def preflight(input_path: str, output_path: str, max_memory: int | None) -> None:
    """Refuses (UnreadableModel / MemoryError / WriteError) what optimize cannot do, before the
    tensors are read: a file that is not an ONNX model or whose external data is missing or
    truncated, a model whose estimated peak exceeds ``max_memory``, an output folder without room
    for the output. A model file too large to read just for its sizes is judged by its size (and
    checked again once loaded)."""
    size = os.path.getsize(input_path)
    if size <= GRAPH_ONLY_BYTES:
        files = model_files(input_path)
        g, external_input, out_bytes = files.tensor_bytes, files.external, files.tensor_bytes + files.file_bytes
    else:
        g, external_input, out_bytes = size, False, size
    check_memory(input_path, g, external_input, max_memory)
    _check_disk(out_bytes, output_path)


def check_memory(path: str, tensor_bytes: int, external_input: bool, max_memory: int | None) -> None:
    """MemoryError when optimize's estimated peak for this model exceeds ``max_memory``."""
    if max_memory is None:
        return
    need = estimated_peak(tensor_bytes, inline_input=not external_input,
                          external_output=external_input or tensor_bytes > AUTO_EXTERNAL_BYTES)
    if need > max_memory:
        raise MemoryError(_too_large(path, tensor_bytes, need, max_memory))


def _too_large(path: str, tensor_bytes: int, need: int, max_memory: int) -> str:
    return (f"{path}: a model of {_gb(tensor_bytes)} of tensors needs about {_gb(need)} of memory to optimize "
            f"and check, more than the {_gb(max_memory)} allowed (--max-memory; by default the memory available "
            f"now); nothing was read or written")


def _check_disk(out_bytes: int, output_path: str) -> None:
    folder = os.path.dirname(os.path.abspath(output_path))
    probe = folder
    while not os.path.isdir(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return
    if free < out_bytes:
        raise WriteError(errno.ENOSPC, f"cannot write {output_path}: about {_gb(out_bytes)} needed, "
                                       f"{_gb(free)} free in {probe}")


# --------------------------------------------------------------------------------------------
# optimize: rewrite, check, write
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Report:
    result: RewriteResult | None = None
    checked: list[str] = dataclasses.field(default_factory=list)
    error: str = ""
    written: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.error


def _session(path: str, providers: Sequence[str]) -> Any:
    import onnxruntime as ort

    from ._session import InferenceSession

    so = ort.SessionOptions()
    # Without prepacking, ORT reads the weights of a model with external data straight from the
    # memory-mapped data file (page cache the kernel can reclaim) instead of copying each
    # MatMul/Conv weight into a packed buffer of its own; measured: the same peak RSS and time
    # for the check (docs/optimize.md, "Memory and time"). The rewrite changes no such op.
    so.add_session_config_entry("session.disable_prepacking", "1")
    return InferenceSession(path, so, providers=providers)


def _missing_ops(path: str, providers: Sequence[str]) -> list[str]:
    """Ops of the model at ``path`` that nothing here runs (see opbridge check)."""
    import onnx

    from ._check import classify

    proto = onnx.load(path, load_external_data=False)
    return [u.name for u in classify(proto, providers) if not u.provider]


def check_against(original: str, rewritten: str, *, providers: Sequence[str], dims: Mapping[str, int],
                  runs: int, tol: float | None, out: TextIO, seed: int = 0) -> str:
    """Runs both models on the same random inputs and compares every output. Returns "" when they
    agree, else what went wrong (also printed).

    One ONNX Runtime session at a time: the original runs on every input first and its outputs
    are kept; its session is released before the rewritten model's is made, so that the weights
    are never held twice."""
    import onnxruntime as ort

    from ._check import random_inputs

    missing = _missing_ops(original, providers)
    use_reference = False
    if missing:
        if set(missing) <= {f"{MS_DOMAIN}::GroupNorm"}:
            use_reference = True
        else:
            return (f"cannot check the rewrite: the original model uses {', '.join(missing)}, which nothing "
                    f"here runs ({', '.join(providers)}); nothing was written")

    def make_feeds(session: Any) -> list[dict[str, np.ndarray]]:
        return [random_inputs(session, dims, seed=seed + run) for run in range(runs)]

    refs: list[list[np.ndarray]] = []
    names: list[str] = []
    feeds: list[dict[str, np.ndarray]] = []
    if not use_reference:
        # The original first: where it cannot be loaded either (a bfloat16 Conv has no CPU kernel),
        # the rewrite is not what failed.
        try:
            session = _session(original, providers)
        except Exception as e:  # ORT raises its own exception types
            return (f"onnxruntime {ort.__version__} cannot load the original model with {', '.join(providers)}, "
                    f"so the rewrite cannot be checked (--provider selects another execution provider): {e}")
        names = [o.name for o in session.get_outputs()]
        try:
            feeds = make_feeds(session)
        except ValueError as e:
            return f"cannot check the rewrite: {e}"
        try:
            refs = [session.run(names, f) for f in feeds]
        except Exception as e:
            return f"running the original model failed: {e}"
        session = None
        gc.collect()  # ORT's session objects may form cycles: its weights go now
    try:
        session = _session(rewritten, providers)
    except Exception as e:
        return f"onnxruntime {ort.__version__} cannot load the rewritten model: {e}"
    if use_reference:
        names = [o.name for o in session.get_outputs()]
        try:
            feeds = make_feeds(session)
        except ValueError as e:
            return f"cannot check the rewrite: {e}"
    how = ("onnx's reference evaluator, com.microsoft::GroupNorm in float64 numpy" if use_reference
           else f"onnxruntime {ort.__version__}")
    print(f"\ncheck: {runs} run(s) on random inputs; original in {how}, rewritten in onnxruntime "
          f"{ort.__version__} with opbridge ({', '.join(providers)})", file=out)
    tol_text = (f"{tol:g}" if tol is not None else
                "1e-3 (float32, float64), 2e-2 (float16), 5e-2 (bfloat16), exact (integers)")
    print(f"  agreement required per output: max |rewritten - original| <= tol * max(1, max |original|); "
          f"tol {tol_text}", file=out)
    worst: dict[str, tuple[float, str]] = {}
    failure = ""
    for run in range(runs):
        if use_reference:
            try:
                ref = _reference_outputs(original, feeds[run], names)
            except Exception as e:
                return f"running the original model failed: {e}"
        else:
            ref = refs[run]
        try:
            got = session.run(names, feeds[run])
        except Exception as e:
            return f"running the rewritten model failed: {e}"
        if run == 0:
            for arg, value in feeds[run].items():
                print(f"  input  {arg}: {value.dtype} {list(value.shape)}", file=out)
        for name, g, r in zip(names, got, ref):
            t = tol if tol is not None else tolerance_for(np.asarray(r).dtype)
            ratio, summary = compare(g, r, t)
            if name not in worst or ratio > worst[name][0]:
                worst[name] = (ratio, f"{np.asarray(r).dtype} {list(np.shape(r))}: {summary}")
            if ratio > 1 and not failure:
                failure = f"output {name!r} disagrees on run {run + 1}: {summary}"
    session = None
    gc.collect()
    for name, (ratio, summary) in worst.items():
        print(f"  output {name}: {summary}{'' if ratio <= 1 else '  DISAGREES'}", file=out)
    return failure


def optimize(input_path: str, output_path: str, *, silu: bool = True, providers: Sequence[str] | None = None,
             dims: Mapping[str, int] | None = None, runs: int = DEFAULT_RUNS, tolerance: float | None = None,
             seed: int = 0, out: TextIO | None = None, max_memory: int | None = None) -> Report:
    """Rewrites the model at ``input_path``, checks it and writes it to ``output_path`` (with its
    external data file beside it when the input had external data or its tensors pass
    AUTO_EXTERNAL_BYTES). Nothing is written when the check fails; the input files are only read.

    max_memory: bytes; a model whose estimated peak (``estimated_peak``) exceeds it is refused
    (MemoryError) before its tensors are read. Unreadable input: UnreadableModel; a file that
    cannot be written (a full disk): WriteError; both name the file and the reason."""
    out = out or sys.stdout
    providers = list(providers or ["CPUExecutionProvider"])
    input_path, output_path = os.fspath(input_path), os.fspath(output_path)
    report = Report()
    preflight(input_path, output_path, max_memory)
    try:
        model = load(input_path)
        check_external_files(model)
    except Exception as e:  # protobuf's DecodeError, a missing external data file, ...
        raise UnreadableModel(f"cannot read {input_path} as an ONNX model: {e}") from e
    if model.ir_version is None or model.ir_version <= 0:
        raise UnreadableModel(f"cannot read {input_path}: it is not an ONNX model (it parses as protobuf but has no "
                              "IR version)")
    external = uses_external_data(model)
    check_memory(input_path, tensor_bytes(model), external, max_memory)  # exact now
    external = external or tensor_bytes(model) > AUTO_EXTERNAL_BYTES
    result = report.result = rewrite_model(model, silu=silu)

    print(f"opbridge optimize: {input_path} -> {output_path}", file=out)
    if result.changed:
        print(f"rewritten into {DOMAIN}::{OP_TYPE}:", file=out)
        width = max(len(k) for k in result.counts)
        for label, n in result.counts.items():
            if n:
                print(f"  {label:{width}s}  x{n}", file=out)
    else:
        print("no GroupNorm pattern found: the model is unchanged", file=out)
        # Written as read (the rules' shape inference filled in value types it need not keep).
        model = None
        gc.collect()
        model = load(input_path)
    if result.skipped:
        print("left unchanged:", file=out)
        for note in result.skipped:
            print(f"  {note}", file=out)

    folder = os.path.dirname(os.path.abspath(output_path))
    # Written to a scratch folder beside the destination first: checked from there, then renamed
    # into place, so that a failed check or write leaves nothing behind and IN may equal OUT.
    with writing(output_path):
        os.makedirs(folder, exist_ok=True)
        scratch = tempfile.mkdtemp(prefix=".opbridge-optimize-", dir=folder)
    try:
        tmp_model = os.path.join(scratch, os.path.basename(output_path))
        with writing(output_path):
            save(model, tmp_model, external)
        model = None
        gc.collect()  # the model's graph forms cycles: its tensors go now, before the check
        if result.changed:
            failure = check_against(input_path, tmp_model, providers=providers, dims=dims or {}, runs=runs,
                                    tol=tolerance, out=out, seed=seed)
            if failure:
                report.error = failure
                print(f"\nFAILED: {failure}", file=out)
                print(f"  {output_path} was not written.", file=out)
                return report
        moved = []
        data = os.path.join(scratch, data_file_name(output_path))
        with writing(output_path):
            if os.path.exists(data):
                os.replace(data, os.path.join(folder, data_file_name(output_path)))
                moved.append(os.path.join(os.path.dirname(output_path), data_file_name(output_path)))
            os.replace(tmp_model, output_path)
        moved.insert(0, output_path)
        report.written = moved
        print(f"\nwrote {' + '.join(moved)}", file=out)
        return report
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def parse_dims(items: Sequence[str]) -> dict[str, int]:
    """NAME=SIZE strings (``--dim``) -> {name: size}; ValueError naming the bad item."""
    parsed = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().isdigit():
            raise ValueError(f"--dim expects NAME=SIZE with SIZE >= 0, got {item!r}")
        parsed[name] = int(value)
    return parsed


def main(input_path: str, output_path: str, *, silu: bool = True, providers: Sequence[str] | None = None,
         dims: Sequence[str] = (), runs: int = DEFAULT_RUNS, tolerance: float | None = None, seed: int = 0,
         max_memory: str | None = None) -> int:
    """The ``opbridge optimize`` command. Exit status: 0 written; 1 the check failed (nothing
    written); 2 bad arguments, an unreadable input, a model too large for the memory allowed, or
    an output that could not be written."""
    try:
        parsed = parse_dims(dims)
        limit = parse_size(max_memory) if max_memory is not None else available_memory()
    except ValueError as e:
        print(f"opbridge optimize: {e}", file=sys.stderr)
        return 2
    if runs < 1:
        print(f"opbridge optimize: --runs must be >= 1, got {runs}", file=sys.stderr)
        return 2
    if tolerance is not None and not (tolerance > 0):
        print(f"opbridge optimize: --tolerance must be > 0, got {tolerance}", file=sys.stderr)
        return 2
    if not os.path.isfile(input_path):
        print(f"opbridge optimize: {input_path}: no such file", file=sys.stderr)
        return 2
    try:
        report = optimize(input_path, output_path, silu=silu, providers=providers, dims=parsed, runs=runs,
                          tolerance=tolerance, seed=seed, max_memory=limit)
    except ImportError as e:
        print(f"opbridge optimize needs onnx, onnxscript and onnxruntime: {e}", file=sys.stderr)
        return 2
    except (UnreadableModel, MemoryError, WriteError) as e:
        print(f"opbridge optimize: {e}", file=sys.stderr)
        return 2
    return 0 if report.ok else 1
