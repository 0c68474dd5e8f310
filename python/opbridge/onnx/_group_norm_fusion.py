"""The GroupNorm fusion: GroupNorm in the forms exporters and other tools write (torch's
decomposition, GroupNormalization-18/21, com.microsoft::GroupNorm), made one
``ai.opbridge::GroupNorm`` node, with a following SiLU fused into it.

Its rules run in the stages of onnx/_rewrite.py: ``opbridge.onnx.export(fuse=True)`` on the
exporter's model, ``opbridge optimize`` (opbridge/_optimize.py) on models exported by anyone. The
conditions of each rule: docs/optimize.md. Needs onnx_ir and onnxscript; not torch.

What the rules write comes from GroupNorm's declaration (ops/group_norm/group_norm_decl.cpp):
its ONNX op type and domain, the activation it fuses and the op version that attribute needs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

import numpy as np

from .._library import MS_DOMAIN
from .._op_library import opbridge_library

if TYPE_CHECKING:
    from .._declarations import AttrDecl

_GROUP_NORM = opbridge_library().ops["group_norm"]
DOMAIN = _GROUP_NORM.domain
OP_TYPE = _GROUP_NORM.onnx_type
# The activation the rules fuse: one of the declared values of GroupNorm's `activation`.
SILU = "silu"
if SILU not in cast("AttrDecl", _GROUP_NORM.arg("activation")).choices:  # pragma: no cover - a declaration without SiLU
    raise ImportError(f"opbridge: GroupNorm's declaration has no activation {SILU!r}; the fusion needs it")
# The op version that introduced `activation`: a model with a node that sets it imports the domain
# at least at this version.
ACTIVATION_DOMAIN_VERSION = _GROUP_NORM.arg("activation").since
# The largest constant a rule reads (a per-channel vector of 262144 float32 channels): no step of
# the fusion reads, copies or folds a larger tensor (docs/optimize.md, "Real-size models").
RULE_CONSTANT_BYTES = 1 << 20

_NOT_REWRITTEN = "not rewritten"
# More channels than any model has: X's dims are the file's word, and a rewrite builds vectors of
# one value per channel (a default scale, a per-group scale expanded), which a lying dim would make
# gigabytes.
MAX_CHANNELS = 1 << 24


def _too_many_channels(channels: int) -> str:
    return (f"{_NOT_REWRITTEN}: X states {channels} channels, more than the {MAX_CHANNELS} a rewrite builds "
            "per-channel vectors for")


# --------------------------------------------------------------------------------------------
# Helpers over onnx_ir values
# --------------------------------------------------------------------------------------------


def _ir() -> Any:
    import onnx_ir as ir

    return ir


def _float_types() -> set[Any]:
    ir = _ir()
    return {ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16}


def _const(value: Any) -> np.ndarray | None:
    """The constant behind ``value`` (initializer or Constant node), or None. A constant of more
    than RULE_CONSTANT_BYTES is never read: the rules only need small vectors (shapes, per-group
    and per-channel parameters, a scalar), and a larger one is never a GroupNorm parameter."""
    if value is None:
        return None
    ir = _ir()
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None or int(tensor.nbytes) > RULE_CONSTANT_BYTES:
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


def _rules_module() -> Any:
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


def _make_rule_classes() -> Any:
    """The rule classes (built on first use, so that importing this module stays cheap)."""
    ir = _ir()
    pattern = _rules_module()

    # The rules' base class is onnxscript's, imported on first use (Any to mypy).
    class _ToGroupNorm(pattern.RewriteRuleClassBase):  # type: ignore[misc,name-defined]
        """Shared rewrite: a _Plan -> (Transpose) GroupNorm (Transpose)."""

        def __init__(self, session: _Session, name: str) -> None:
            super().__init__(name=name)
            self.session = session
            self._plan: _Plan | None = None
            self._graph: Any = None

        def _fail(self, node: Any, reason: str, note: bool = True) -> Any:
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
            y = getattr(op, OP_TYPE)(x, scale, bias, _domain=DOMAIN, **attrs)
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

        def pattern(self, op: Any, x: Any, grouped_shape: Any, in_scale: Any, in_bias: Any, out_shape: Any, weight: Any,
                    bias: Any) -> Any:
            grouped = op.Reshape(x, grouped_shape, _outputs=["grouped"])
            normed = op.InstanceNormalization(grouped, in_scale, in_bias, _outputs=["normed"])
            y = op.Reshape(normed, out_shape, _outputs=["restored"]) if self.restore else normed
            if self.mul:
                y = op.Mul(y, weight)
            if self.add:
                y = op.Add(y, bias)
            return y

        def check(self, context: Any, x: Any, grouped_shape: Any, in_scale: Any, in_bias: Any, grouped: Any,
                  normed: Any, out_shape: Any = None, restored: Any = None, weight: Any = None, bias: Any = None,
                  **_: Any) -> Any:
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

        def _analyze(self, x: Any, grouped_shape: Any, in_scale: Any, in_bias: Any, out_shape: Any, grouped: Any,
                     normed: Any, restored: Any, weight: Any, bias: Any) -> _Plan:
            if x.dtype not in _float_types():
                raise _Skip(f"{_NOT_REWRITTEN}: X has type {x.dtype}, GroupNorm takes float types")
            dims = _dims(x)
            if dims is None or len(dims) < 2:
                raise _Skip(f"{_NOT_REWRITTEN}: the rank of X is unknown or < 2")
            rank, channels = len(dims), dims[1]
            if channels is None:
                raise _Skip(f"{_NOT_REWRITTEN}: the channel count X.shape[1] is not static")
            if channels > MAX_CHANNELS:
                raise _Skip(_too_many_channels(channels))
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
            per_group = (channels // groups) * math.prod(cast("list[int]", spatial)) if None not in spatial else None
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
        def _restores(out_shape: Any, restored: Any, x: Any, dims: Any) -> bool:
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

        def rewrite(self, op: Any, x: Any, normed: Any = None, restored: Any = None, **_: Any) -> Any:
            return self._emit(op, cast(_Plan, self._plan), (restored if self.restore else normed).name or "group_norm")

    class GroupNormalization(_ToGroupNorm):
        """GroupNormalization-18 (per-group scale/bias) or -21 (per-channel)."""

        def __init__(self, session: _Session, name: str, per_channel: bool) -> None:
            super().__init__(session, name)
            self.per_channel = per_channel

        def pattern(self, op: Any, x: Any, scale: Any, bias: Any) -> Any:
            return op.GroupNormalization(x, scale, bias, _outputs=["y"])

        def check(self, context: Any, x: Any, scale: Any, bias: Any, y: Any, **_: Any) -> Any:
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
            if channels is not None and channels > MAX_CHANNELS:
                return self._fail(node, _too_many_channels(channels))
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

        def rewrite(self, op: Any, x: Any, y: Any = None, **_: Any) -> Any:
            return self._emit(op, cast(_Plan, self._plan), y.name or "group_norm")

    class MicrosoftGroupNorm(_ToGroupNorm):
        """com.microsoft::GroupNorm(X, gamma, beta; activation, channels_last=1, epsilon, groups)."""

        def pattern(self, op: Any, x: Any, gamma: Any, beta: Any) -> Any:
            return op.GroupNorm(x, gamma, beta, _domain=MS_DOMAIN, _outputs=["y"])

        def check(self, context: Any, x: Any, gamma: Any, beta: Any, y: Any, **_: Any) -> Any:
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
            if channels is not None and channels > MAX_CHANNELS:
                return self._fail(node, _too_many_channels(channels))
            self._plan = _Plan(x=x, num_groups=groups, epsilon=a.get_float("epsilon", 1e-5), channels=channels,
                               scale=gamma, bias=beta, activation=SILU if activation == 1 else "none",
                               channels_last_rank=rank)
            return pattern.MatchResult()

        def rewrite(self, op: Any, x: Any, y: Any = None, **_: Any) -> Any:
            plan = cast(_Plan, self._plan)  # check() set it
            # gamma/beta may be float32 for a float16 X (type M): constants are converted here,
            # other values get a Cast in _vector.
            plan.scale = _as_const_or_value(plan.scale)
            plan.bias = _as_const_or_value(plan.bias)
            return self._emit(op, plan, y.name or "group_norm")

    class SameTypeCastLike(pattern.RewriteRuleClassBase):  # type: ignore[misc,name-defined]
        """CastLike(v, like) where v already has like's type, and like is the output of a GroupNorm
        decomposition (a Reshape of an InstanceNormalization) or of the Mul after it: the dynamo
        exporter writes Mul(restored, CastLike(w, restored)) and Add(·, CastLike(b, ·)) for
        bfloat16, and those second readers kept the Mul and Add (and a following SiLU) out of the
        rewrite."""

        def __init__(self, session: _Session) -> None:
            super().__init__(name="opbridge.same_type_cast_like")
            self.session = session
            self._graph: Any = None

        def pattern(self, op: Any, v: Any, like: Any) -> Any:
            return op.CastLike(v, like)

        @staticmethod
        def _restored(value: Any) -> bool:
            """Whether value is Reshape(InstanceNormalization(...), ...)."""
            node = value.producer()
            if node is None or node.op_type != "Reshape" or node.inputs[0] is None:
                return False
            source = node.inputs[0].producer()
            return source is not None and source.op_type == "InstanceNormalization"

        def check(self, context: Any, v: Any, like: Any, **_: Any) -> Any:
            self._graph = context.graph_or_function
            node = like.producer()
            after_mul = node is not None and node.op_type == "Mul" and any(
                i is not None and self._restored(i) for i in node.inputs)
            if not (self._restored(like) or after_mul):
                return pattern.MatchResult().fail("not after a GroupNorm decomposition")
            if v.dtype is None or v.dtype != like.dtype:
                return pattern.MatchResult().fail("a real cast")
            return pattern.MatchResult()

        def rewrite(self, op: Any, v: Any, **_: Any) -> Any:
            # A constant (the exporters' weight and bias: C elements) is copied into a new
            # initializer; anything else is replaced as _replacement says.
            arr = _const(v)
            if arr is not None and (v.is_initializer() or v.producer() is not None):
                name = self.session.fresh_name(self._graph, v.name or "cast_like")
                return op.initializer(ir.tensor(arr, dtype=v.dtype, name=name), name=name)
            return _replacement(op, v)

    class TransposePair(pattern.RewriteRuleClassBase):  # type: ignore[misc,name-defined]
        """Transpose(Transpose(v, p1), p2) with p1 then p2 the identity -> v, where one of the two
        was inserted around a channels-last GroupNorm."""

        def __init__(self, tag: str) -> None:
            super().__init__(name="opbridge.cancel_transposes")
            self.tag = tag

        def pattern(self, op: Any, v: Any) -> Any:
            return op.Transpose(op.Transpose(v, _outputs=["t1"]), _outputs=["t2"])

        def check(self, context: Any, v: Any, t1: Any, t2: Any, **_: Any) -> Any:
            n1, n2 = t1.producer(), t2.producer()
            from onnxscript.rewriter import RULE_NAME_TAG

            if not any(self.tag in (n.metadata_props.get(RULE_NAME_TAG) or "") for n in (n1, n2)):
                return pattern.MatchResult().fail("neither Transpose was inserted by opbridge")
            p1, p2 = n1.attributes.get_ints("perm", None), n2.attributes.get_ints("perm", None)
            if p1 is None or p2 is None or len(p1) != len(p2) or any(p1[p2[i]] != i for i in range(len(p2))):
                return pattern.MatchResult().fail("not inverse permutations")
            return pattern.MatchResult()

        def rewrite(self, op: Any, v: Any, t2: Any = None, **_: Any) -> Any:
            return _replacement(op, v)

    class FuseSilu(pattern.RewriteRuleClassBase):  # type: ignore[misc,name-defined]
        """ai.opbridge::GroupNorm followed by a SiLU form -> GroupNorm(activation="silu")."""

        def __init__(self, form: str) -> None:
            super().__init__(name=f"opbridge.fuse_silu.{form}")
            self.form = form

        def pattern(self, op: Any, x: Any, one: Any) -> Any:
            y = getattr(op, OP_TYPE)(x, _domain=DOMAIN, _allow_other_inputs=True, _outputs=["gn"])
            if self.form == "sigmoid_mul":
                return op.Mul(y, op.Sigmoid(y))
            if self.form == "swish":
                return op.Swish(y, _outputs=["act"])
            if self.form == "quick_gelu":
                return op.QuickGelu(y, _domain=MS_DOMAIN, _outputs=["act"])
            return op.Div(y, op.Add(op.Exp(op.Neg(y)), one))  # y / (1 + exp(-y))

        def check(self, context: Any, gn: Any, one: Any = None, act: Any = None, **_: Any) -> Any:
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

        def rewrite(self, op: Any, gn: Any = None, **_: Any) -> Any:
            node = gn.producer()
            attrs = {k: v for k, v in node.attributes.items() if k != "activation"}
            attrs["activation"] = SILU
            return getattr(op, OP_TYPE)(*node.inputs, _domain=DOMAIN, **attrs)

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

def rule_stages(sources: Sequence[str], silu: bool) -> tuple[list[Any], list[Any], _Session]:
    """The GroupNorm fusion's stages for ``sources`` (a subset of _rewrite.SOURCES), as
    (label, rules, what to run after them when they changed something): the GroupNorm forms, then,
    with ``silu``, the SiLU fusion (to run after every other rewrite, so that it sees each
    GroupNorm); and the session whose ``skipped`` notes what matched but was left."""
    import onnx_ir.passes.common as passes

    Decomposition, GroupNormalization, MicrosoftGroupNorm, TransposePair, FuseSilu, SameTypeCastLike = (
        _make_rule_classes())
    session = _Session()
    ms_rule_name = "opbridge.com_microsoft_group_norm"

    # (label, rules, what to run after them when they changed something)
    stages: list[tuple[str, list[Any], Callable[[Any], Any] | None]] = []
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
    silu_stages: list[tuple[str, list[Any], Callable[[Any], Any] | None]] = []
    if silu:
        forms = ("sigmoid_mul", "swish", "quick_gelu", "div")
        silu_stages.append((LABEL_SILU, [FuseSilu.rule(form) for form in forms], None))
    return stages, silu_stages, session


def finish(model: Any) -> None:
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
