"""Multi-scale deformable attention in existing ONNX models: the per-level GridSample chains that
plain exports of the DETR family contain (transformers' ``MultiScaleDeformableAttention`` and
``multi_scale_deformable_attention[_v2]``, mmcv's and Ultralytics' ``multi_scale_deformable_attn_pytorch``,
Deformable-DETR's ``ms_deform_attn_core_pytorch``), each made one
``ai.opbridge::MultiScaleDeformableAttention`` node. ``opbridge optimize`` runs it (onnx/_rewrite.py
has its stages); docs/optimize.md describes what is rewritten and what is left.

How a chain is recognised. The rule is anchored where the chain ends, ``ReduceSum(Mul(samples,
weights))`` (with the Reshape and Transpose that usually follow), and proves the rest by following
every tensor back to where it is not merely rearranged:

* the samples side ends in L ``GridSample`` nodes (bilinear, zero padding, align_corners=0: exactly
  the op's sampling), stacked or concatenated level by level;
* each GridSample's image comes, through Reshape/Transpose/Slice/Split/... only, from one tensor
  holding every level's values (the op's ``value``), and its grid from one tensor of locations
  through the same kinds of ops and the affine map ``2·x − 1`` (the op's ``sampling_locations``);
* the weights side comes, the same way, from one tensor (the op's ``attention_weights``).

Each tensor is given a layout (a list of axes, each a row-major group of named factors: batch n,
positions S, heads m, channels d, queries q, levels l, points p, coordinates c) and every op on the
way is applied to that layout symbolically: a Reshape regroups factors (sizes compared as
polynomials over the graph's own size values, so shapes computed in the graph are followed), a
Slice or Split of S cuts it into level segments, a Gather on l selects a level. The chain is
rewritten only when, under that layout, what it computes is the op's formula index for index: each
level's image is the segment of its level (contiguous, in order, together all of S), its grid the
same level's locations, the weights paired with the samples of the same (n, m, q, l, p), and the
sum over exactly the levels and points. Anything else -- another interpolation or padding mode,
align_corners=1, another affine map, a reduction over other axes, weights in another layout -- is
left as it is, with the reason in the report.

The node's ``spatial_shapes`` and ``level_start_index`` are built from the sizes the chain itself
uses (constants, or in-graph computations from the same values when shapes are dynamic), so they
stay correct for every input size the original model accepts.

Needs onnx_ir and onnxscript; not torch.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Iterable, Iterator, Sequence, cast, overload

import numpy as np

from .._op_library import opbridge_library

_MSDA = opbridge_library().ops["ms_deform_attn"]
DOMAIN = _MSDA.domain
OP_TYPE = _MSDA.onnx_type
# The ai.opbridge version that introduced the op: a model with the node imports at least this.
DOMAIN_VERSION = _MSDA.since
LABEL = "MultiScaleDeformableAttention: per-level GridSample, Mul, ReduceSum (one per attention module)"
NOT_REWRITTEN = "multi-scale deformable attention not rewritten"
# The largest constant read (shape vectors, scalars); larger tensors are never read.
_CONST_BYTES = 1 << 16
# A Slice end at or beyond this means "to the end of the axis".
_OPEN_END = 1 << 31
_MAX_DEPTH = 64
_MAX_LEVELS = 16  # kMsDeformAttnMaxLevels

_MOVES = {"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Cast", "Slice", "Split", "Gather"}
_AFFINE = {"Mul", "Add", "Sub", "Div"}


class _Fail(Exception):
    """The chain is not the op; the message says why."""


# --------------------------------------------------------------------------------------------
# Sizes: integer polynomials over the graph's size values
# --------------------------------------------------------------------------------------------


def _divide_term(k: tuple[Any, ...], v: int, ok: tuple[Any, ...], ov: int) -> tuple[tuple[Any, ...], int] | None:
    """The term v·k divided by the term ov·ok, when exact: ok's leaves all in k, ov divides v."""
    rest = list(k)
    for leaf in ok:
        if leaf not in rest:
            return None
        rest.remove(leaf)
    if v % ov:
        return None
    return tuple(rest), v // ov


class Poly:
    """An integer polynomial: {sorted tuple of leaf names: coefficient}. Leaves are sizes the graph
    holds (a dim of a tensor, an element of an integer tensor, a symbolic dim's name)."""

    __slots__ = ("terms", "_hash")

    def __init__(self, terms: dict[Any, Any] | None = None) -> None:
        self.terms = {k: v for k, v in (terms or {}).items() if v}
        self._hash = hash(frozenset(self.terms.items()))

    @staticmethod
    def const(c: int) -> "Poly":
        return Poly({(): int(c)})

    @staticmethod
    def leaf(name: str) -> "Poly":
        return Poly({(name,): 1})

    def is_const(self) -> bool:
        return all(k == () for k in self.terms)

    @property
    def value(self) -> int | None:
        return self.terms.get((), 0) if self.is_const() else None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Poly) and self.terms == other.terms

    def __hash__(self) -> int:
        return self._hash

    def __add__(self, other: "Poly") -> "Poly":
        t = dict(self.terms)
        for k, v in other.terms.items():
            t[k] = t.get(k, 0) + v
        return Poly(t)

    def __neg__(self) -> "Poly":
        return Poly({k: -v for k, v in self.terms.items()})

    def __sub__(self, other: "Poly") -> "Poly":
        return self + (-other)

    def __mul__(self, other: "Poly") -> "Poly":
        t: dict[Any, Any] = {}
        for k1, v1 in self.terms.items():
            for k2, v2 in other.terms.items():
                k = tuple(sorted(k1 + k2))
                t[k] = t.get(k, 0) + v1 * v2
        return Poly(t)

    def div(self, other: "Poly") -> "Poly | None":
        """self / other when exact (other equal to self, or a monomial dividing every term)."""
        if other == self:
            return ONE
        if len(other.terms) != 1:
            return self._long_div(other)
        (ok, ov), = other.terms.items()
        if ov == 0:
            return None
        out: dict[Any, Any] = {}
        for k, v in self.terms.items():
            q = _divide_term(k, v, ok, ov)
            if q is None:
                return None
            out[q[0]] = out.get(q[0], 0) + q[1]
        return Poly(out)

    def _long_div(self, other: "Poly") -> "Poly | None":
        """self / other when exact, by long division on the largest monomial first (degree, then
        names): sizes of levels computed with floor division are products of sums, e.g.
        16·(1 + a)·(1 + b) / (4 + 4·a) = 4 + 4·b."""
        if not other.terms:
            return None

        def lead(p: "Poly") -> tuple[Any, int]:
            k = max(p.terms, key=lambda m: (len(m), m))
            return k, p.terms[k]

        ok, ov = lead(other)
        rest, out = self, ZERO
        for _ in range(64):  # the quotient's terms; sizes have a handful
            if not rest.terms:
                return out
            q = _divide_term(*lead(rest), ok, ov)
            if q is None:
                return None
            t = Poly({q[0]: q[1]})
            out, rest = out + t, rest - t * other
        return None

    def rename(self, alias: dict[Any, Any]) -> "Poly":
        """self with leaves replaced by the Polys ``alias`` gives for them."""
        if not alias or not any(x in alias for k in self.terms for x in k):
            return self
        out = ZERO
        for k, v in self.terms.items():
            term = Poly.const(v)
            for x in k:
                term = term * alias.get(x, Poly.leaf(x))
            out = out + term
        return out

    def single_leaf(self) -> str | None:
        if len(self.terms) == 1:
            (k, v), = self.terms.items()
            if v == 1 and len(k) == 1:
                return cast(str, k[0])
        return None

    def __repr__(self) -> str:
        if not self.terms:
            return "0"
        return " + ".join(("*".join([str(v)] * (v != 1 or not k) + list(k))) for k, v in sorted(self.terms.items()))


ONE = Poly.const(1)
ZERO = Poly({})


def _prod(polys: Iterable[Poly]) -> Poly:
    out = ONE
    for p in polys:
        out = out * p
    return out


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def floor_div(x: Poly, k: int) -> Poly:
    """x // k for a size x >= 0 and a constant k > 0: exact where every coefficient divides,
    else a leaf named by x and k, so that the same quotient computed in the graph (an integer Div
    of sizes: truncation, which is floor for x >= 0) and written in a symbolic dim
    ("((s0 - 1)//32) + 1", the dynamo exporter's conv output sizes) is one leaf."""
    q = x.div(Poly.const(k))
    return q if q is not None else Poly.leaf(f"floor(({x!r})/{k})")


_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(//|[-+*()]))")


def _parse_dim_param(s: str) -> Poly:
    """torch's symbolic dims: names, and sums, differences and products of them and integers, with
    parentheses and floor division by an integer ("2*s0", "s0*s1", "((s0 - 1)//32) + 1"); anything
    else is one leaf of its own."""
    tokens: list[tuple[str, str]] = []
    pos, text = 0, s.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            return Poly.leaf("p:" + s)
        tokens.append(("int", m.group(1)) if m.group(1) else ("name", m.group(2)) if m.group(2) else ("op", m.group(3)))
        pos = m.end()
    at = [0]

    def peek() -> str | None:
        return tokens[at[0]][1] if at[0] < len(tokens) else None

    def expr() -> Poly:
        out = term()
        while peek() in ("+", "-"):
            op = tokens[at[0]][1]
            at[0] += 1
            out = out + term() if op == "+" else out - term()
        return out

    def term() -> Poly:
        out = factor()
        while peek() in ("*", "//"):
            op = tokens[at[0]][1]
            at[0] += 1
            rhs = factor()
            if op == "*":
                out = out * rhs
            else:
                k = rhs.value
                if k is None or k <= 0:
                    raise ValueError(s)
                out = floor_div(out, k)
        return out

    def factor() -> Poly:
        if at[0] >= len(tokens):
            raise ValueError(s)
        kind, tok = tokens[at[0]]
        at[0] += 1
        if kind == "int":
            return Poly.const(int(tok))
        if kind == "name":
            return Poly.leaf("p:" + tok)
        if tok == "-":
            return -factor()
        if tok == "(":
            out = expr()
            if peek() != ")":
                raise ValueError(s)
            at[0] += 1
            return out
        raise ValueError(s)

    try:
        out = expr()
    except ValueError:
        return Poly.leaf("p:" + s)
    return out if at[0] == len(tokens) else Poly.leaf("p:" + s)


# --------------------------------------------------------------------------------------------
# Graph helpers
# --------------------------------------------------------------------------------------------


def _ir() -> Any:
    import onnx_ir as ir

    return ir


def _const(value: Any) -> np.ndarray | None:
    if value is None:
        return None
    tensor = _ir().convenience.get_const_tensor(value)
    if tensor is None or int(tensor.nbytes) > _CONST_BYTES:
        return None
    return np.asarray(tensor.numpy())


def _rank(value: Any) -> int | None:
    shape = value.shape if value is not None else None
    return None if shape is None else len(shape)


@overload
def _attr_int(node: Any, name: str, default: int) -> int: ...
@overload
def _attr_int(node: Any, name: str, default: int | None) -> int | None: ...


def _attr_int(node: Any, name: str, default: int | None) -> int | None:
    a = node.attributes.get(name)
    return default if a is None else a.as_int()


def _attr_ints(node: Any, name: str) -> list[int] | None:
    a = node.attributes.get(name)
    return None if a is None else list(a.as_ints())


def _axes(node: Any) -> list[int] | None:
    """An Unsqueeze's or a Reduce op's axes: the attribute (older opsets) or the constant second input."""
    axes = _attr_ints(node, "axes")
    if axes is None and len(node.inputs) == 2:
        c = _const(node.inputs[1])
        axes = None if c is None else [int(a) for a in c.reshape(-1)]
    return axes


def _attr_str(node: Any, name: str, default: str) -> str:
    a = node.attributes.get(name)
    return default if a is None else a.as_string()


def _label(node: Any) -> str:
    return f"{node.op_type}{' ' + repr(node.name) if node.name else ''}"


# How far back a rank is looked for where shape inference left a value without one (through a
# decoder layer's ops to the previous layer's boxes, say); each value is looked at once.
_MAX_RANK_DEPTH = 200


class _Sizes:
    """Symbolic dims of values and contents of small integer tensors (shape computations), as
    Polys; leaves remember the value they read so that a size can be rebuilt in the graph."""

    def __init__(self) -> None:
        self.sources: dict[str, tuple[str, Any, int]] = {}  # leaf -> ("dim" | "elem", value, index)
        self._dims: dict[int, list[Poly] | None] = {}
        self._ints: dict[int, list[Poly] | None] = {}
        self._ranks: dict[int, int | None] = {}  # ranks from producers and readers
        self.layouts: dict[int, "_Info"] = {}  # values whose layout a rule has derived
        self.s_size: Poly | None = None  # the size of the values' S axis
        self.alias: dict[str, Poly] = {}  # leaf -> the size it is taken to equal

    def unify(self, a: Poly, b: Poly) -> None:
        """Takes two sizes to be equal: the batch (or query count) of the values, locations and
        weights, which the chain's GridSample and Mul need equal for the model to run at all."""
        a, b = self.canon(a), self.canon(b)
        if a == b:
            return
        if b.single_leaf() is None:
            a, b = b, a
        leaf = b.single_leaf()
        if leaf is None or leaf in (x for k in a.terms for x in k):
            return
        for k, v in list(self.alias.items()):
            self.alias[k] = v.rename({leaf: a})
        self.alias[leaf] = a

    def canon(self, p: Poly) -> Poly:
        return p.rename(self.alias)

    def reset(self) -> None:
        """Forgets derived layouts and what was computed from them (a new hypothesis)."""
        self.layouts.clear()
        self._dims.clear()
        self._ints.clear()
        self._ranks.clear()
        self.s_size = None
        self.alias.clear()

    def _leaf(self, kind: str, value: Any, i: int) -> Poly:
        name = f"{'d' if kind == 'dim' else 'v'}:{value.name or id(value)}:{i}"
        self.sources.setdefault(name, (kind, value, i))
        return Poly.leaf(name)

    def dims(self, value: Any, depth: int = 0) -> list[Poly] | None:
        info = self.layouts.get(id(value))
        if info is not None:
            return [_prod(a.size for a in ax) for ax in info.axes]
        key = id(value)
        if key not in self._dims:
            self._dims[key] = None  # cycles
            self._dims[key] = self._dims_uncached(value, depth)
        result = self._dims[key]
        return None if result is None else [self.canon(p) for p in result]

    def _dims_uncached(self, value: Any, depth: int) -> list[Poly] | None:
        derived: Sequence[Poly | None] | None
        shape = value.shape
        if shape is None:
            # Shape inference gave up: the rank and dims from the producer where it is simple.
            r = self.rank(value)
            if r is None:
                return None
            derived = self._derived_dims(value, r, depth) or [None] * r
            return [d if d is not None else self._leaf("dim", value, i) for i, d in enumerate(derived)]
        out: list[Poly] = []
        derived = None
        for i, d in enumerate(shape.dims):
            if isinstance(d, int):
                out.append(Poly.const(d))
                continue
            text = getattr(d, "value", None)
            if isinstance(text, str) and text:
                p = _parse_dim_param(text)
                # A dim is where a leaf can be read only when it is that leaf: "2*s0" is not s0.
                leaf = p.single_leaf()
                if leaf is not None:
                    self.sources.setdefault(leaf, ("dim", value, i))
                out.append(p)
                continue
            if derived is None:
                derived = self._derived_dims(value, len(shape), depth) or []
            out.append(cast(Poly, derived[i]) if i < len(derived) and derived[i] is not None
                       else self._leaf("dim", value, i))
        return out

    def rank(self, value: Any, depth: int = 0) -> int | None:
        if value.shape is not None:
            return len(value.shape)
        if depth > 8:
            return None
        r = self._rank_from_producer(value)
        return r if r is not None else self._rank_from_readers(value, depth, self.rank)

    def _rank_from_readers(self, value: Any, depth: int, rank_of: Callable[[Any, int], int | None]) -> int | None:
        """The rank of ``value`` as a reader tells it: a Transpose's perm, or the rank (by
        ``rank_of``) of an Identity's, a Cast's or an elementwise op's with a scalar."""
        for use in value.uses():
            n = use.node
            if n.op_type == "Transpose" and _attr_ints(n, "perm") is not None:
                return len(cast("list[int]", _attr_ints(n, "perm")))
            if n.op_type in ("Identity", "Cast") or (n.op_type in _AFFINE and len(n.inputs) == 2 and any(
                    (c := _const(v)) is not None and c.size == 1 for v in n.inputs)):
                r = rank_of(n.outputs[0], depth + 1)
                if r is not None:
                    return r
        return None

    def _rank_from_producer(self, value: Any) -> int | None:
        node = value.producer()
        if node is None or node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type == "Reshape":
            target = self.ints(node.inputs[1])
            return None if target is None else len(target)
        if node.op_type == "Transpose" and _attr_ints(node, "perm") is not None:
            return len(cast("list[int]", _attr_ints(node, "perm")))
        if node.op_type in ("Identity", "Cast", "Softmax", "Sub", "Mul", "Add", "Div", "Where") and node.inputs:
            ranks = {len(v.shape) if v.shape is not None else None for v in node.inputs
                     if v is not None and _const(v) is None}
            return ranks.pop() if len(ranks) == 1 else None
        return None

    def source_dims(self, value: Any) -> list[Poly] | None:
        """The dims of a candidate source that dims() has none for (shape inference gave none and
        rank() cannot tell): its rank from source_rank(), each dim derived from the producer where
        it is simple, else a size of its own; remembered as the value's dims from then on."""
        r = self.source_rank(value)
        if r is None:
            return None
        derived = self._derived_dims(value, r, 0) or [None] * r
        out = [d if d is not None else self._leaf("dim", value, i) for i, d in enumerate(derived)]
        self._dims[id(value)] = out
        return [self.canon(p) for p in out]

    def source_rank(self, value: Any, depth: int = 0) -> int | None:
        """The rank of a candidate source of the chain, also where shape inference left it without a
        shape: followed back through the producers (and readers) as far as _MAX_RANK_DEPTH. (The
        size tracking itself keeps rank(): what it derives there is what it can follow.)"""
        if value.shape is not None:
            return len(value.shape)
        key = id(value)
        if key in self._ranks:
            return self._ranks[key]
        if depth > _MAX_RANK_DEPTH:
            return None
        self._ranks[key] = None  # cycles
        r = self._source_rank_from_producer(value, depth)
        if r is None:
            r = self._rank_from_readers(value, depth, self.source_rank)
        self._ranks[key] = r
        return r

    def _source_rank_from_producer(self, value: Any, depth: int = 0) -> int | None:
        node = value.producer()
        if node is None or node.domain not in ("", "ai.onnx"):
            return None
        op = node.op_type
        if op == "Constant":
            c = _const(value)
            return None if c is None else c.ndim
        if op in ("Reshape", "Transpose"):
            return self._rank_from_producer(value)
        if not node.inputs or node.inputs[0] is None:
            return None
        if op in ("Identity", "Cast", "Softmax", "Sigmoid", "Relu", "Tanh", "Neg", "Exp", "Log", "Sqrt", "Erf", "Clip",
                  "LayerNormalization", "Dropout", "Slice", "Tile"):
            # The rank of the first input (Slice's starts/ends, Tile's repeats and Clip's bounds keep it).
            return self.source_rank(node.inputs[0], depth + 1)
        if op == "GatherElements" and len(node.inputs) == 2:
            return self.source_rank(node.inputs[1], depth + 1)  # the indices' shape
        if op == "Unsqueeze":
            axes = _axes(node)
            r = self.source_rank(node.inputs[0], depth + 1)
            return None if r is None or axes is None else r + len(axes)
        if op == "MatMul" and len(node.inputs) == 2:
            ra, rb = (self.source_rank(v, depth + 1) for v in node.inputs)
            return None if ra is None or rb is None or min(ra, rb) < 2 else max(ra, rb)
        if op == "Expand" and len(node.inputs) == 2:
            r = self.source_rank(node.inputs[0], depth + 1)
            target, shape = self.ints(node.inputs[1]), node.inputs[1].shape
            n = len(target) if target is not None else shape.dims[0] if shape is not None and len(shape) == 1 else None
            return None if r is None or not isinstance(n, int) else max(r, n)
        if op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceSumSquare"):
            # A LayerNorm decomposed (below opset 17): the rank kept, or less the reduced axes.
            r = self.source_rank(node.inputs[0], depth + 1)
            if r is None or _attr_int(node, "keepdims", 1):
                return r
            axes = _axes(node)
            return None if not axes or r == 0 else r - len({a % r for a in axes})
        if op in ("Sub", "Mul", "Add", "Div", "Pow", "Where"):
            # Broadcasting: the largest rank of the inputs, where every input's rank is known.
            ranks = [self.source_rank(v, depth + 1) for v in node.inputs if v is not None]
            return None if any(r is None for r in ranks) else max(cast("list[int]", ranks))
        return None

    def _derived_dims(self, value: Any, rank: int, depth: int) -> Sequence[Poly | None] | None:
        """Dims of a value that shape inference left unknown, from its producer (a few ops)."""
        node = value.producer()
        if node is None or depth > _MAX_DEPTH or node.domain not in ("", "ai.onnx"):
            return None
        op = node.op_type
        x = node.inputs[0] if node.inputs else None
        if x is None:
            return None
        if op in ("Identity", "Cast", "Relu", "Sigmoid", "Softmax", "Neg", "Not", "Erf", "Tanh", "Sqrt", "Exp",
                  "LayerNormalization", "Dropout") and value is node.outputs[0]:
            return self.dims(x, depth + 1)
        if op == "Transpose":
            d = self.dims(x, depth + 1)
            perm = _attr_ints(node, "perm") or list(range(len(d or [])))[::-1]
            return None if d is None or len(perm) != len(d) else [d[p] for p in perm]
        if op == "Reshape":
            target = self.ints(node.inputs[1], depth + 1)
            d = self.dims(x, depth + 1)
            if target is None or d is None:
                return None
            try:
                return _resolve_target(target, d, _attr_int(node, "allowzero", 0))
            except _Fail:
                return None
        if op == "Concat":
            axis = _attr_int(node, "axis", 0)
            parts: list[Any] = [self.dims(v, depth + 1) for v in node.inputs]  # checked below: none is None
            if any(p is None or len(p) != rank for p in parts):
                return None
            axis %= rank
            out: list[Poly | None] = list(parts[0])
            out[axis] = sum((p[axis] for p in parts[1:]), parts[0][axis])
            return out
        if op in ("Add", "Sub", "Mul", "Div", "Where"):
            parts = [self.dims(v, depth + 1) for v in node.inputs if v is not None]
            parts = [p for p in parts if p is not None and len(p) == rank]
            if not parts:
                return None
            out = []
            for i in range(rank):
                sizes = {p[i] for p in parts if p[i] != ONE}
                out.append(sizes.pop() if len(sizes) == 1 else (ONE if not sizes else None))
            return out
        return None

    def ints(self, value: Any, depth: int = 0) -> list[Poly] | None:
        """The elements of a rank-0 or rank-1 integer value, as Polys (None when unknown)."""
        if value is None:
            return None
        key = id(value)
        if key not in self._ints:
            self._ints[key] = None
            self._ints[key] = self._ints_uncached(value, depth)
        result = self._ints[key]
        return None if result is None else [self.canon(p) for p in result]

    def _ints_uncached(self, value: Any, depth: int) -> list[Poly] | None:
        arr = _const(value)
        if arr is not None:
            if not np.issubdtype(arr.dtype, np.integer) or arr.ndim > 1:
                return None
            return [Poly.const(int(v)) for v in arr.reshape(-1)]
        node = value.producer()
        result = None
        if node is not None and depth <= _MAX_DEPTH and node.domain in ("", "ai.onnx"):
            result = self._ints_of(node, value, depth)
        if result is None:
            r = _rank(value)
            shape = value.shape
            if r == 0:
                return [self._leaf("elem", value, 0)]
            if r == 1 and isinstance(shape.dims[0], int):
                return [self._leaf("elem", value, i) for i in range(shape.dims[0])]
        return result

    def _ints_of(self, node: Any, value: Any, depth: int) -> list[Poly] | None:
        op = node.op_type
        ins = node.inputs
        if op == "Shape":
            d = self.dims(ins[0], depth + 1)
            if d is None:
                return None
            start, end = _attr_int(node, "start", 0), _attr_int(node, "end", None)
            return d[slice(start, end)]
        if op == "Constant":
            return None  # get_const_tensor covers it
        if op in ("Identity", "Cast", "Squeeze", "Unsqueeze", "Reshape"):
            # A 0-D or 1-D integer tensor keeps its elements in order through these.
            return self.ints(ins[0], depth + 1)
        if op == "Gather":
            data, idx = self.ints(ins[0], depth + 1), _const(ins[1])
            if data is None or idx is None or idx.ndim > 1:
                return None
            try:
                return [data[int(i)] for i in idx.reshape(-1)]
            except IndexError:
                return None
        if op == "Slice":
            data = self.ints(ins[0], depth + 1)
            consts = [_const(v) if i < len(ins) else None for i, v in enumerate(ins[1:5], 1)] if len(ins) > 2 else []
            if data is None or len(consts) < 2 or consts[0] is None or consts[1] is None:
                return None
            steps = consts[3] if len(consts) > 3 and consts[3] is not None else np.array([1])
            if consts[0].size != 1 or int(steps.reshape(-1)[0]) != 1:
                return None
            # Python's slicing clamps and counts from the end as ONNX's Slice does (step 1).
            return data[int(consts[0].reshape(-1)[0]):int(consts[1].reshape(-1)[0])]
        if op == "Concat":
            parts = [self.ints(v, depth + 1) for v in ins]
            if any(p is None for p in parts):
                return None
            return [x for p in parts for x in cast("list[Poly]", p)]
        if op in ("Add", "Sub", "Mul", "Div"):
            a, b = self.ints(ins[0], depth + 1), self.ints(ins[1], depth + 1)
            if a is None or b is None or (len(a) != len(b) and 1 not in (len(a), len(b))):
                return None
            n = max(len(a), len(b))
            a, b = a * n if len(a) == 1 else a, b * n if len(b) == 1 else b
            out = []
            for x, y in zip(a, b):
                if op == "Add":
                    out.append(x + y)
                elif op == "Sub":
                    out.append(x - y)
                elif op == "Mul":
                    out.append(x * y)
                else:
                    q = x.div(y)
                    if q is None and y.is_const() and cast(int, y.value) > 0 and value.dtype is not None \
                            and value.dtype.is_integer():
                        q = floor_div(x, cast(int, y.value))
                        if q.single_leaf() is not None:
                            self.sources.setdefault(cast(str, q.single_leaf()), ("elem", value, len(out)))
                    if q is None:
                        return None
                    out.append(q)
            return out
        if op == "ReduceProd":
            data = self.ints(ins[0], depth + 1)
            return None if data is None else [_prod(data)]
        return None


def _resolve_target(target: list[Poly], dims: list[Poly], allowzero: int) -> list[Poly]:
    """A Reshape's target with its 0 (copy) and -1 (the rest) entries replaced by sizes."""
    out = list(target)
    for i, t in enumerate(out):
        if t == ZERO and not allowzero:
            if i >= len(dims):
                raise _Fail("a Reshape copies a dim its input does not have")
            out[i] = dims[i]
    minus = [i for i, t in enumerate(out) if t == Poly.const(-1)]
    if len(minus) > 1:
        raise _Fail("a Reshape has more than one -1")
    if minus:
        known = _prod(t for i, t in enumerate(out) if i != minus[0])
        rest = _prod(dims).div(known)
        if rest is None:
            shown = ", ".join(str(t.value) if t.is_const() else "?" for t in target)
            why = "" if _prod(dims).is_const() else \
                ", which depends on the inputs' sizes (an export that holds sizes of its example?)"
            raise _Fail(f"cannot tell what a Reshape's -1 stands for: its target ({shown}) does not divide "
                        f"its input's size{why}")
        out[minus[0]] = rest
    return out


# --------------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Atom:
    """A factor of a tensor's elements: a named index range of a given size."""

    name: str
    size: Poly


@dataclasses.dataclass
class _Segment:
    parent: str
    start: Poly
    end: Poly | None  # None: to the end of the parent
    size: Poly


@dataclasses.dataclass
class _Info:
    """A tensor's layout: axes of row-major atom groups (atoms of size 1 left out), the levels it
    was selected for ({atom: index}), and the affine map a·x + b applied to the source's values."""

    axes: tuple[Any, ...]
    tags: dict[Any, Any] = dataclasses.field(default_factory=dict)
    affine: tuple[Any, ...] = (1.0, 0.0)


class _Tracker:
    """Applies data-movement ops to layouts. Shared by the three sides of one chain so that atoms
    split or cut on one side are known to all."""

    def __init__(self, sizes: _Sizes) -> None:
        self.sizes = sizes
        self.splits: dict[str, tuple[Poly, Poly]] = {}
        self.segments: dict[str, _Segment] = {}
        self.source_atoms: list[_Atom] = []

    def atom(self, name: str) -> _Atom | None:
        return next((a for a in self.source_atoms if a.name == name), None)

    @staticmethod
    def norm(axes: Iterable[Iterable[_Atom]]) -> tuple[Any, ...]:
        return tuple(tuple(a for a in ax if a.size != ONE) for ax in axes)

    def split(self, atom: _Atom, first: Poly, rest: Poly) -> tuple[_Atom, _Atom]:
        known = self.splits.get(atom.name)
        if known is not None and known != (first, rest):
            raise _Fail(f"the factor {atom.name} is split in two different ways")
        self.splits[atom.name] = (first, rest)
        return _Atom(atom.name + ".0", first), _Atom(atom.name + ".1", rest)

    def regroup(self, atoms: list[_Atom], targets: list[Poly]) -> tuple[Any, ...]:
        queue = [a for a in atoms if a.size != ONE]
        out = []
        for t in targets:
            group: list[_Atom] = []
            need = t
            while need != ONE:
                if not queue:
                    raise _Fail("a Reshape's target does not match its input")
                a = queue[0]
                q = need.div(a.size)
                if q is not None:
                    group.append(queue.pop(0))
                    need = q
                    continue
                r = a.size.div(need)
                if r is not None and r != ONE:
                    head, tail = self.split(a, need, r)
                    group.append(head)
                    queue[0] = tail
                    need = ONE
                    continue
                raise _Fail(f"cannot follow a Reshape: target size {t} against factors of sizes "
                            f"{', '.join(str(x.size) for x in queue)}")
            out.append(tuple(group))
        if queue:
            raise _Fail("a Reshape's target does not match its input")
        return tuple(out)

    def segment(self, atom: _Atom, start: Poly, end: Poly | None) -> _Atom:
        """The atom cut to [start, end) (end None: to its end)."""
        if start == ZERO and (end is None or end == atom.size):
            return atom
        if atom.name in self.segments or "[" in atom.name:
            raise _Fail("a level segment is cut again")
        size = (atom.size if end is None else end) - start
        name = f"{atom.name}[{start}:{'' if end is None else end}]"
        self.segments[name] = _Segment(atom.name, start, end, size)
        return _Atom(name, size)

    def apply(self, node: Any, info: _Info, out_index: int) -> _Info:
        op = node.op_type
        axes = info.axes
        rank = len(axes)
        new = dataclasses.replace(info, tags=dict(info.tags))
        if op in ("Identity", "Cast"):
            return new
        if op == "Transpose":
            perm = _attr_ints(node, "perm") or list(range(rank))[::-1]
            if sorted(perm) != list(range(rank)):
                raise _Fail("a Transpose's perm does not fit its input")
            new.axes = tuple(axes[p] for p in perm)
            return new
        if op == "Unsqueeze":
            ax = _axes(node)
            if ax is None:
                raise _Fail("an Unsqueeze's axes are not constant")
            r = rank + len(ax)
            ax = sorted(a % r for a in ax)
            out = list(axes)
            for a in ax:
                out.insert(a, ())
            new.axes = tuple(out)
            return new
        if op == "Squeeze":
            ax = _axes(node)
            drop = {a % rank for a in ax} if ax is not None else {i for i, a in enumerate(axes) if not a}
            if any(axes[a] for a in drop):
                raise _Fail("a Squeeze removes an axis that may not have size 1")
            new.axes = tuple(a for i, a in enumerate(axes) if i not in drop)
            return new
        if op == "Flatten":
            k = _attr_int(node, "axis", 1) % (rank + 1) if rank else 0
            new.axes = (tuple(a for ax in axes[:k] for a in ax), tuple(a for ax in axes[k:] for a in ax))
            return new
        if op == "Reshape":
            target = self.sizes.ints(node.inputs[1])
            if target is None:
                raise _Fail("a Reshape's target shape is not computed from known sizes")
            dims = [_prod(a.size for a in ax) for ax in axes]
            resolved = _resolve_target(target, dims, _attr_int(node, "allowzero", 0))
            new.axes = self.regroup([a for ax in axes for a in ax], resolved)
            return new
        if op == "Slice":
            ins = node.inputs
            starts, ends = self.sizes.ints(ins[1]), self.sizes.ints(ins[2])
            sax = _const(ins[3]) if len(ins) > 3 and ins[3] is not None else None
            steps = _const(ins[4]) if len(ins) > 4 and ins[4] is not None else None
            if starts is None or ends is None or (len(ins) > 3 and ins[3] is not None and sax is None):
                raise _Fail("a Slice's bounds are not computed from known sizes")
            if steps is not None and np.any(steps != 1):
                raise _Fail("a Slice has a step other than 1")
            sl_axes = sax.reshape(-1).tolist() if sax is not None else list(range(len(starts)))
            out = list(axes)
            for a, s, e in zip(sl_axes, starts, ends):
                a %= rank
                end = None if (e.value is not None and e.value >= _OPEN_END) else e
                if (s.value is not None and s.value < 0) or (end is not None and end.value is not None and end.value < 0):
                    raise _Fail("a Slice counts from the end")
                out[a] = self._cut_axis(axes[a], s, end, new)
            new.axes = self.norm(out)
            return new
        if op == "Split":
            a = _attr_int(node, "axis", 0) % rank
            sizes = self.sizes.ints(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
            if sizes is None:
                attr = _attr_ints(node, "split")
                sizes = [Poly.const(v) for v in attr] if attr is not None else None
            if sizes is None:
                parts = _attr_int(node, "num_outputs", len(node.outputs))
                whole = _prod(x.size for x in axes[a])
                each = whole.div(Poly.const(parts))
                if each is None:
                    raise _Fail("a Split's parts are not of known sizes")
                sizes = [each] * parts
            start = _sum(sizes[:out_index])
            end = None if out_index == len(sizes) - 1 else start + sizes[out_index]
            out = list(axes)
            out[a] = self._cut_axis(axes[a], start, end, new)
            new.axes = self.norm(out)
            return new
        if op == "Gather":
            idx = _const(node.inputs[1])
            a = _attr_int(node, "axis", 0) % rank
            if idx is None or idx.size != 1:
                raise _Fail("a Gather does not select one constant index")
            i = int(idx.reshape(-1)[0])
            cut = self._cut_axis(axes[a], Poly.const(i), Poly.const(i + 1), new)
            out = list(axes)
            if idx.ndim == 0:
                del out[a]
            else:
                out[a] = cut
            new.axes = tuple(out)
            return new
        raise _Fail(f"{op} is not a data-movement op")

    def _cut_axis(self, axis: tuple[Any, ...], start: Poly, end: Poly | None, info: _Info) -> tuple[Any, ...]:
        if not axis:
            if start == ZERO and (end is None or end == ONE):
                return ()  # index 0 of an axis of size 1
            raise _Fail("a Slice, Split or Gather cuts an axis of size 1")
        if len(axis) != 1:
            if start == ZERO and end is None:
                return axis
            raise _Fail("a Slice, Split or Gather cuts an axis that is not one factor")
        atom = axis[0]
        if end is not None and end - start == ONE:
            # One index (a level, or a level of one pixel or point): kept as a tag.
            if start.value is not None and (start.value < 0 or (atom.size.value is not None
                                                                  and start.value >= atom.size.value)):
                raise _Fail("an index out of range")
            info.tags[atom.name if "[" not in atom.name else atom.name.split("[")[0]] = start
            return ()
        return (self.segment(atom, start, end),)


def _sum(polys: Sequence[Poly]) -> Poly:
    out = ZERO
    for p in polys:
        out = out + p
    return out


def _affine(node: Any, info: _Info) -> _Info | None:
    """info after x·c, x + c, x − c, c − x or x / c with c a scalar constant; None otherwise."""
    op = node.op_type
    if op not in _AFFINE or len(node.inputs) != 2:
        return None
    c0, c1 = _const(node.inputs[0]), _const(node.inputs[1])
    a, b = info.affine
    if c1 is not None and c1.size == 1:
        c = float(c1.reshape(-1)[0])
        new = {"Mul": (a * c, b * c), "Add": (a, b + c), "Sub": (a, b - c),
               "Div": (a / c, b / c) if c else None}[op]
    elif c0 is not None and c0.size == 1:
        c = float(c0.reshape(-1)[0])
        new = {"Mul": (a * c, b * c), "Add": (a, b + c), "Sub": (-a, c - b), "Div": None}[op]
    else:
        return None
    return None if new is None else dataclasses.replace(info, tags=dict(info.tags), affine=new)


def _path_affine(chain: list[tuple[Any, Any]]) -> tuple[float, float]:
    """The scalar affine map a _back chain applies from its far end to its start: a reason names
    the map from the locations, whichever candidate source was tried."""
    info = _Info(axes=())
    for _, node in reversed(chain):
        if node is not None and node.op_type in _AFFINE:
            info = _affine(node, info) or info
    return info.affine


def _affine_operand(node: Any) -> Any:
    """The non-constant operand of an affine node."""
    c0 = _const(node.inputs[0])
    return node.inputs[1] if c0 is not None and c0.size == 1 else node.inputs[0]


# --------------------------------------------------------------------------------------------
# Paths back from the GridSample inputs and the weights
# --------------------------------------------------------------------------------------------


def _back(value: Any, affine: bool) -> list[tuple[Any, Any]]:
    """[(value, producer)] from ``value`` back through data-movement (and, with ``affine``, scalar
    affine) ops, ``value`` first; the last entry's producer is something else (or None)."""
    chain = []
    seen = set()
    while value is not None and id(value) not in seen:
        seen.add(id(value))
        node = value.producer()
        chain.append((value, node))
        if node is None or node.domain not in ("", "ai.onnx"):
            break
        if node.op_type in _MOVES:
            value = node.inputs[0]
        elif affine and node.op_type in _AFFINE and _affine(node, _Info(axes=())) is not None:
            value = _affine_operand(node)
        else:
            break
    return chain


def _common(chains: list[list[tuple[Any, Any]]]) -> list[Any]:
    """The values all chains share, nearest first (the trunk before the levels part)."""
    ids = [{id(v) for v, _ in c} for c in chains]
    return [v for v, _ in chains[0] if all(id(v) in s for s in ids[1:])]


# Layouts a source tensor may have: axis names per rank. Merged factors are split by the chain.
_VALUE_FORMS = {4: [("n", "S", "m", "d")], 3: [("n", "S", "C"), ("S", "n", "C")]}
_LOC_FORMS = {6: [("n", "q", "m", "l", "p", "c")], 5: [("n", "q", "m", "LP", "c")]}
_WEIGHT_FORMS = {5: [("n", "q", "m", "l", "p")], 4: [("n", "q", "m", "LP")], 3: [("n", "q", "MLP")]}
# Roles of split factors: C -> (m, d); MLP -> (m, LP) -> (m, (l, p)); LP -> (l, p).
_ROLE = {"C.0": "m", "C.1": "d", "MLP.0": "m", "MLP.1": "LP", "LP.0": "l", "LP.1": "p", "MLP.1.0": "l",
         "MLP.1.1": "p"}


def _role(name: str) -> str:
    return _ROLE.get(name, name)


# The factors' names in the reasons a chain is left alone.
_WORDS = {"n": "batch", "S": "positions", "m": "heads", "d": "channels", "q": "queries", "l": "levels",
          "p": "points", "c": "coordinates", "LP": "levels·points"}


def _words(roles: Iterable[Any]) -> str:
    return "(" + ", ".join(_WORDS.get(r, str(r)) for r in roles) + ")"


def _affine_text(a: float, b: float) -> str:
    return f"{a:g}·x {'−' if b < 0 else '+'} {abs(b):g}"


def _roles(axis: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(_role(a.name) for a in axis)


@dataclasses.dataclass
class _Source:
    value: Any
    form: tuple[Any, ...]  # axis names


@dataclasses.dataclass
class _Plan:
    value: _Source
    loc: _Source
    weights: _Source
    levels: list[Any]  # [(H Poly, W Poly, start Poly)] in level order
    covers_all: bool  # the levels together are all of S (else value is cut to their end)
    end: Poly | None
    out_axes: tuple[Any, ...]  # layout of the replaced value, in roles
    sizes: dict[Any, Any]  # role -> Poly (M, D, L, P, 2)
    dtype: Any
    flat_loc: "_FlatLoc | None" = None  # the locations' arithmetic, to recompute in the flat layout


# --------------------------------------------------------------------------------------------
# The analysis of one chain
# --------------------------------------------------------------------------------------------


class _Analysis:
    """Proves that one ReduceSum(Mul(...)) ends a deformable-attention chain; the plan to replace it."""

    def __init__(self, sizes: _Sizes) -> None:
        self.sizes = sizes
        self.stage = 0

    def run(self, mul: Any, reduce_node: Any, tail: list[Any]) -> _Plan:
        a, b = mul.inputs
        for samples, weights in ((a, b), (b, a)):
            grids = _grid_samples(samples)
            if grids is not None:
                break
        else:
            raise _Fail("no GridSample feeds the Mul before the ReduceSum")
        if len(grids) > _MAX_LEVELS:
            raise _Fail(f"{len(grids)} levels; the op takes at most {_MAX_LEVELS}")
        for g, _ in grids:
            _check_grid_sample(g)
        vchains = [_back(g.inputs[0], False) for g, _ in grids]
        lchains = [_back(g.inputs[1], True) for g, _ in grids]
        wchain = _back(weights, False)
        best: tuple[int, str] = (-1, "the values, locations or weights do not come from tensors of the expected ranks")
        sizes = self.sizes
        for vsrc in _candidates(_common(vchains), _VALUE_FORMS, sizes):
            for lsrc in _candidates(_common(lchains), _LOC_FORMS, sizes):
                for wsrc in _candidates([v for v, _ in wchain], _WEIGHT_FORMS, sizes):
                    self.stage = 0
                    try:
                        return self._verify(vsrc, lsrc, wsrc, vchains, lchains, wchain, grids, samples,
                                            reduce_node, tail)
                    except _Fail as e:
                        # Of equally far candidates the last, whose sources lie furthest back:
                        # its reason is about the whole chain (the grid's affine map from the
                        # locations, not from a value half-way).
                        if self.stage >= best[0]:
                            best = (self.stage, str(e))
        raise _Fail(best[1])

    def _verify(self, vsrc: Any, lsrc: Any, wsrc: Any, vchains: Any, lchains: Any, wchain: Any, grids: Any,
                samples: Any, reduce_node: Any, tail: Any) -> _Plan:
        mul = reduce_node.inputs[0].producer()
        sizes = self.sizes
        sizes.reset()
        tr = _Tracker(sizes)
        dims = []
        for src in (vsrc, lsrc, wsrc):
            d = sizes.dims(src.value)
            if d is None:
                d = sizes.source_dims(src.value)
            if d is None or len(d) != len(src.form):
                raise _Fail("a source's rank is unknown")
            dims.append(dict(zip(src.form, d)))
        for role in ("n", "q", "m", "l", "p", "LP"):
            have = [d[role] for d in dims if role in d]
            for other in have[1:]:
                sizes.unify(have[0], other)
        sizes.unify(dims[1]["c"], Poly.const(2))
        dims = [{k: sizes.canon(v) for k, v in d.items()} for d in dims]
        vinfo = self._source_info(tr, vsrc)
        linfo = self._source_info(tr, lsrc)
        winfo = self._source_info(tr, wsrc)
        levels_of = []
        outs = []
        for (g, _), vch, lch in zip(grids, vchains, lchains):
            x = self._follow(tr, vsrc.value, vinfo, vch, affine=False)
            self.stage = max(self.stage, 1)
            grid = self._follow(tr, lsrc.value, linfo, lch, affine=True)
            self.stage = max(self.stage, 2)
            if x.affine != (1.0, 0.0) or len(x.axes) != 4:
                raise _Fail("a GridSample's image is not (N·M, D, H, W) of the values")
            if grid.affine != (2.0, -1.0):
                a, b = _path_affine(lch)
                raise _Fail(f"the grid of {_label(g)} is {_affine_text(a, b)} of the locations, not 2·x − 1")
            if len(grid.axes) != 4:
                raise _Fail("a GridSample's grid is not 4-D")
            if _roles(x.axes[0]) not in (("n", "m"), ("m",)) or _roles(x.axes[1]) != ("d",):
                raise _Fail("a GridSample's image is not (N·M, D, H, W) of the values")
            if not _same_roles(_roles(x.axes[0]), _roles(grid.axes[0])):
                raise _Fail("a GridSample's image and grid do not pair the same batch and head")
            if _roles(grid.axes[1]) != ("q",) or _roles(grid.axes[3]) != ("c",):
                raise _Fail("a GridSample's grid is not (N·M, Lq, P, 2) of the locations")
            levels_of.append((_value_level(tr, x), _grid_level(tr, grid)))
            self.stage = max(self.stage, 3)
            out = _Info(axes=(x.axes[0], x.axes[1], grid.axes[1], grid.axes[2]),
                        tags={k: v for k, v in grid.tags.items() if k == "l"})
            sizes.layouts[id(g.outputs[0])] = out
            outs.append(out)
        role_sizes = self._role_sizes(tr)
        self.stage = max(self.stage, 4)
        levels, covers, end = self._levels(levels_of, role_sizes)
        self.stage = max(self.stage, 5)
        combined = self._combine(tr, grids, outs, samples)
        self.stage = max(self.stage, 6)
        wi = self._follow(tr, wsrc.value, winfo, wchain, affine=False)
        prod = _mul(combined, wi, mul)
        self.stage = max(self.stage, 7)
        info = self._reduce(reduce_node, prod, role_sizes)
        self.stage = max(self.stage, 8)
        sizes.layouts[id(reduce_node.outputs[0])] = info
        for node in tail:
            info = tr.apply(node, info, 0)
            sizes.layouts[id(node.outputs[0])] = info
        if info.tags:
            raise _Fail("the result is one index of an axis")
        out_roles = tuple(_roles(ax) for ax in info.axes)
        flat = [r for ax in out_roles for r in ax]
        if len(flat) != len(set(flat)) or not set(flat) <= {"n", "q", "m", "d"}:
            raise _Fail("the sum leaves other axes than batch, queries, heads and channels")
        plan = _Plan(value=vsrc, loc=lsrc, weights=wsrc, levels=levels, covers_all=covers, end=end,
                     out_axes=out_roles, sizes=role_sizes, dtype=vsrc.value.dtype)
        plan.flat_loc = _flat_locations(plan, [mul, reduce_node, *tail], sizes)
        return plan

    def _source_info(self, tr: "_Tracker", src: _Source) -> _Info:
        dims = self.sizes.dims(src.value)
        if dims is None or len(dims) != len(src.form):
            raise _Fail("a source's rank is unknown")
        atoms = [_Atom(name, self.sizes.canon(d)) for name, d in zip(src.form, dims)]
        tr.source_atoms.extend(atoms)
        if "S" in src.form:
            self.sizes.s_size = dims[src.form.index("S")]
        return _Info(axes=_Tracker.norm((a,) for a in atoms))

    def _follow(self, tr: "_Tracker", source: Any, info: _Info, chain: list[Any], affine: bool) -> _Info:
        """The layout at the start of ``chain`` (a _back list) given ``info`` at ``source``."""
        idx = next((i for i, (v, _) in enumerate(chain) if v is source), None)
        if idx is None:
            raise _Fail("a path does not pass the source")
        for value, node in reversed(chain[:idx]):
            known = self.sizes.layouts.get(id(value))
            if known is not None:
                info = known
                continue
            if node.op_type in _AFFINE:
                new = _affine(node, info) if affine else None
                if new is None:
                    raise _Fail(f"{_label(node)} on the way is not a scalar affine map")
                info = new
            else:
                k = next(i for i, o in enumerate(node.outputs) if o is value)
                info = tr.apply(node, info, k)
            self.sizes.layouts[id(value)] = info
        return info

    def _role_sizes(self, tr: "_Tracker") -> dict[Any, Any]:
        out: dict[str, int] = {}

        def note(atom: _Atom) -> None:
            if atom.name in tr.splits:
                first, rest = tr.splits[atom.name]
                note(_Atom(atom.name + ".0", first))
                note(_Atom(atom.name + ".1", rest))
            role = _role(atom.name)
            if role in ("m", "d", "l", "p", "c", "LP") and atom.size.value is not None:
                if out.get(role, atom.size.value) != atom.size.value:
                    raise _Fail(f"the number of {_WORDS.get(role, role)} differs between the values, locations and "
                                "weights")
                out[role] = atom.size.value

        for atom in tr.source_atoms:
            note(atom)
        for name in ("m", "d"):
            if name not in out:
                raise _Fail(f"the number of {'heads' if name == 'm' else 'channels per head'} is not static")
        if out.get("c", 2) != 2:
            raise _Fail("the locations do not end in (x, y) pairs")
        return out

    def _levels(self, levels_of: list[Any], sizes: dict[Any, Any]) -> Any:
        """[(H, W, start)] in level order, whether they cover all of S, and the last end. The i-th
        level of the values must be sampled with the i-th level's locations."""
        n = len(levels_of)
        sizes["L"] = n
        remaining = list(range(n))
        order, start = [], ZERO
        while remaining:
            i = next((i for i in remaining if levels_of[i][0][0] == start), None)
            if i is None or start is None:
                raise _Fail("the levels of the values are not contiguous from the start of S")
            order.append(i)
            remaining.remove(i)
            start = levels_of[i][0][1]
        out = []
        lp_start = ZERO
        points = set()
        for level, i in enumerate(order):
            (st, _end, h, w), grid = levels_of[i]
            if grid[0] == "l":
                if grid[1] != Poly.const(level) and not (n == 1 and grid[1] is None):
                    raise _Fail(f"level {level} of the values is sampled with another level of the locations")
                if "p" in sizes:
                    points.add(sizes["p"])
            else:
                gs, ge = grid[1], grid[2]
                if gs != lp_start or ge is None and level != n - 1:
                    raise _Fail(f"level {level} of the values is sampled with another level's points")
                if ge is not None:
                    if (ge - gs).value is None:
                        raise _Fail("the points per level are not static")
                    points.add((ge - gs).value)
                    lp_start = ge
                elif "LP" in sizes:
                    points.add(sizes["LP"] - (lp_start.value or 0) if lp_start.is_const() else -1)
            out.append((h, w, st))
        if grid[0] != "l" and "LP" in sizes:
            if len(points) != 1:
                raise _Fail(f"the levels have different numbers of points ({sorted(points)}); the op takes one")
            sizes["p"] = points.pop()
        elif "p" not in sizes:
            sizes["p"] = 1
        end = levels_of[order[-1]][0][1]
        s_size = self._s_size
        covers = end is None or (s_size is not None and end == s_size)
        return out, covers, end

    @property
    def _s_size(self) -> Poly | None:
        return self.sizes.s_size

    def _combine(self, tr: "_Tracker", grids: list[Any], outs: list[Any], samples: Any) -> _Info:
        infos = []
        for (g, schain), out in zip(grids, outs):
            info = out
            for value, node in reversed(schain[:-1]):
                k = next(i for i, o in enumerate(node.outputs) if o is value)
                info = tr.apply(node, info, k)
                self.sizes.layouts[id(value)] = info
            infos.append(info)
        chain = _back(samples, False)
        if len(infos) == 1:
            info = infos[0]
            info = _Info(axes=info.axes)
        else:
            node = chain[-1][1]
            rank = len(infos[0].axes)
            axis = _attr_int(node, "axis", 0) % rank
            rest = [_roles(a) for i, a in enumerate(infos[0].axes) if i != axis]
            if any([_roles(a) for i, a in enumerate(inf.axes) if i != axis] != rest for inf in infos):
                raise _Fail("the levels' samples are combined with different layouts")
            axes = list(infos[0].axes)
            if all(not inf.axes[axis] for inf in infos) and all("l" in inf.tags for inf in infos):
                if [inf.tags["l"] for inf in infos] != [Poly.const(i) for i in range(len(infos))]:
                    raise _Fail("the levels' samples are not stacked in level order")
                axes[axis] = (_Atom("l", Poly.const(len(infos))),)
            else:
                cuts = [_points_cut(tr, inf.axes[axis], inf.tags) for inf in infos]
                if any(c is None for c in cuts):
                    raise _Fail("the levels' samples are not stacked or concatenated along their level or "
                                "points axis")
                start = ZERO
                for s, e in cast("list[tuple[Any, ...]]", cuts):  # none is None (checked above)
                    if s != start:
                        raise _Fail("the levels' samples are not concatenated in level order")
                    start = e
                whole = tr.atom("LP")
                if whole is None or not (start is None or start == whole.size):
                    raise _Fail("the levels' samples do not cover all points")
                axes[axis] = (whole,)
            info = _Info(axes=tuple(axes))
            self.sizes.layouts[id(chain[-1][0])] = info
        for value, node in reversed(chain[:-1]):
            info = tr.apply(node, info, 0)
            self.sizes.layouts[id(value)] = info
        return info

    def _reduce(self, node: Any, info: _Info, sizes: dict[Any, Any]) -> _Info:
        r = len(info.axes)
        ax = _axes(node)
        if ax is None:
            raise _Fail("the ReduceSum's axes are not constant")
        ax = sorted({a % r for a in ax})
        reduced = sorted(role for a in ax for role in _expand_lp(_roles(info.axes[a])))
        required = sorted(x for x in ("l", "p") if sizes.get("L" if x == "l" else "p", 1) > 1)
        if reduced != required:
            raise _Fail(f"{_label(node)} sums over {_words(reduced) if reduced else 'nothing'}, not over the "
                        "levels and points")
        keep = _attr_int(node, "keepdims", 1)
        axes = [(() if i in ax else a) for i, a in enumerate(info.axes)] if keep else \
            [a for i, a in enumerate(info.axes) if i not in ax]
        return _Info(axes=tuple(axes))


def _grid_samples(samples: Any) -> list[tuple[Any, list[Any]]] | None:
    """[(GridSample, the _back chain from the combining point to it)] in the order they are
    combined; None when the operand does not come from GridSamples."""
    chain = _back(samples, False)
    node = chain[-1][1]
    if node is not None and node.op_type == "GridSample" and node.domain in ("", "ai.onnx"):
        return [(node, chain)]
    if node is None or node.op_type != "Concat":
        return None
    out = []
    for v in node.inputs:
        c = _back(v, False)
        g = c[-1][1]
        if g is None or g.op_type != "GridSample" or g.domain not in ("", "ai.onnx"):
            return None
        out.append((g, c))
    return out


def _check_grid_sample(g: Any) -> None:
    mode = _attr_str(g, "mode", "bilinear")
    pad = _attr_str(g, "padding_mode", "zeros")
    if mode not in ("bilinear", "linear"):
        raise _Fail(f"GridSample mode={mode!r} (the op interpolates bilinearly)")
    if pad != "zeros":
        raise _Fail(f"GridSample padding_mode={pad!r} (the op reads zeros outside the map)")
    if _attr_int(g, "align_corners", 0):
        raise _Fail("GridSample align_corners=1 (the op samples pixel centres as align_corners=0 does)")
    if _rank(g.inputs[0]) not in (None, 4):
        raise _Fail("a GridSample that is not 2-D")


def _value_level(tr: "_Tracker", x: _Info) -> tuple[Any, ...]:
    """(start, end or None, H, W) of the level a GridSample's image is."""
    extra = set(x.tags) - {"S"}
    if extra:
        raise _Fail("a GridSample's image is one index of the values' axis " + ", ".join(sorted(extra)))
    hw = x.axes[2] + x.axes[3]
    if not hw:
        if "S" not in x.tags:
            raise _Fail("a GridSample's image is not one level of the values")
        st = x.tags["S"]
        return st, st + ONE, ONE, ONE
    if "S" in x.tags:
        raise _Fail("a GridSample's image is not one level of the values")
    h, w = _prod(a.size for a in x.axes[2]), _prod(a.size for a in x.axes[3])
    if len(hw) == 1:
        base = hw[0].name
    elif len(hw) == 2 and hw[0].name.endswith(".0") and hw[1].name == hw[0].name[:-2] + ".1":
        base = hw[0].name[:-2]
    else:
        raise _Fail("a GridSample's image is not one level of the values, rows then columns")
    if base == "S":
        return ZERO, None, h, w
    seg = tr.segments.get(base)
    if seg is None or seg.parent != "S":
        raise _Fail("a GridSample's image is not one level of the values, rows then columns")
    return seg.start, seg.end, h, w


def _grid_level(tr: "_Tracker", grid: _Info) -> tuple[Any, ...]:
    """("l", level index Poly or None) or ("lp", start, end or None) of a GridSample's grid."""
    points = grid.axes[2]
    if "l" in grid.tags:
        if _roles(points) not in (("p",), ()):
            raise _Fail("a GridSample's grid columns are not the points of one level")
        return "l", grid.tags["l"]
    cut = _points_cut(tr, points, grid.tags)
    if cut is not None:
        return ("lp",) + cut
    if _roles(points) in (("p",), ()) and not grid.tags:
        return "l", None  # a single level
    raise _Fail("a GridSample's grid is not one level of the locations")


def _points_cut(tr: "_Tracker", axis: tuple[Any, ...], tags: dict[Any, Any]) -> tuple[Any, ...] | None:
    """(start, end or None) of the part of the LP (levels x points) axis that ``axis`` is."""
    if not axis and "LP" in tags:
        return tags["LP"], tags["LP"] + ONE
    if len(axis) == 1 and axis[0].name in tr.segments and tr.segments[axis[0].name].parent == "LP":
        seg = tr.segments[axis[0].name]
        return seg.start, seg.end
    return None


def _mul(s: _Info, w: _Info, node: Any) -> _Info:
    r = max(len(s.axes), len(w.axes))
    sa = ((),) * (r - len(s.axes)) + tuple(s.axes)
    wa = ((),) * (r - len(w.axes)) + tuple(w.axes)
    if w.tags or s.tags:
        raise _Fail("the weights are one index of an axis")
    for x, y in zip(sa, wa):
        rx, ry = _expand_lp(_roles(x)), _expand_lp(_roles(y))
        if _same_roles(rx, ry) or (not ry and rx == ("d",)):
            continue
        raise _Fail(f"the attention weights of {_label(node)} are not laid out like the samples they weigh "
                    f"(an axis {_words(ry)} against the samples' {_words(rx)})")
    return _Info(axes=sa)


def _same_roles(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Equal roles, or equal but for the batch on one side only: a batch left out is one of static
    size 1, and the two sides meet in an op that needs equal sizes, so the other is 1 too."""
    if a == b:
        return True
    return tuple(r for r in a if r != "n") == tuple(r for r in b if r != "n") and ("n" in a) != ("n" in b)


def _expand_lp(roles: tuple[Any, ...]) -> tuple[Any, ...]:
    out: list[str] = []
    for r in roles:
        out.extend(("l", "p") if r == "LP" else (r,))
    return tuple(out)


def _candidates(values: list[Any], forms: dict[Any, Any], sizes: "_Sizes") -> Iterator[_Source]:
    for v in values:
        for form in forms.get(sizes.source_rank(v), ()):
            yield _Source(v, form)


# --------------------------------------------------------------------------------------------
# The locations' arithmetic in the flat layout
# --------------------------------------------------------------------------------------------

# Elementwise ops of the locations' arithmetic (reference points plus scaled offsets) that are
# recomputed in the flat layout; at most this many of them.
_FLAT_OPS = {"Add", "Sub", "Mul", "Div"}
_FLAT_MAX_OPS = 8


@dataclasses.dataclass
class _FlatLoc:
    """The elementwise expression that computes the locations (N, Lq, M, L, P, 2): ``ops`` in
    evaluation order, each (op_type, operand keys, key), operands being keys of earlier results or
    of ``leaves``: (value, its rank, its sizes at the axes (M, L, P, 2) aligned from the right, each
    1 or the full size)."""

    ops: list[Any]
    leaves: dict[int, Any]
    root: int


def _flat_locations(plan: _Plan, ends: list[Any], sizes: _Sizes) -> _FlatLoc | None:
    """The plain exports compute the locations as written, e.g. ``reference_points[:, :, None, :,
    None, :] + offsets / normalizer[None, None, None, :, None, :]``: elementwise ops broadcasting
    (N, Lq, 1, L, 1, 2) against (N, Lq, M, L, P, 2), whose inner runs of 2 and 1 elements make
    ONNX Runtime's loops slower than the sampling itself. The same ops on the same values with
    each small operand's level pairs repeated over the points first and every operand viewed as
    (.., .., M or 1, L·P·2) broadcast only over the heads, with L·P·2 contiguous elements inside
    (what ``opbridge.nn`` computes): bit-identical results. Returns that expression when the
    locations come from such ops alone and nothing else reads them or any step between them and
    the sum (else the original ops would stay and run as well); None otherwise."""
    if plan.loc.form != ("n", "q", "m", "l", "p", "c"):
        return None
    s = plan.sizes
    m, levels, points = (s.get(k) for k in ("m", "L", "p"))
    if not all(isinstance(v, int) for v in (m, levels, points)):
        return None
    root = plan.loc.value
    # Every op after the locations must go away with the chain (nothing else reads them, not even
    # a Shape whose result feeds anything but the chain), or they would run as well.
    dead = {id(node): True for node in ends}
    budget = [4096]

    def dies(node: Any, depth: int = 0) -> bool:
        key = id(node)
        if key not in dead:
            budget[0] -= 1
            # Cycles, and anything past the budget or _MAX_DEPTH ops from the locations, stay: the
            # chain's ops are a few steps from them, a path past that leads elsewhere.
            dead[key] = False
            if budget[0] > 0 and depth < _MAX_DEPTH:
                dead[key] = all(not out.is_graph_output() and all(dies(use.node, depth + 1) for use in out.uses())
                                for out in node.outputs)
        return dead[key]

    if root.producer() is None or not dies(root.producer()):
        return None
    want = (m, levels, points, 2)
    ops: list[Any] = []
    leaves: dict[int, Any] = {}

    def leaf(v: Any) -> int | None:
        dims = sizes.dims(v)
        if dims is None or len(dims) > 6:
            return None
        tail = [None] * (6 - len(dims)) + [d.value for d in dims]
        inner = [1 if t is None and i < 6 - len(dims) else t for i, t in enumerate(tail)][2:]
        for got, full in zip(inner, want):
            if got not in (1, full):
                return None
        leaves[id(v)] = (v, len(dims), tuple(inner))
        return id(v)

    def walk(v: Any, depth: int) -> int | None:
        node = v.producer()
        if (node is None or node.op_type not in _FLAT_OPS or node.domain not in ("", "ai.onnx")
                or len(node.inputs) != 2 or depth > _FLAT_MAX_OPS):
            return leaf(v) if depth else None
        if depth and (len(list(v.uses())) != 1 or v.is_graph_output()):  # read elsewhere: the op stays
            return None
        keys = []
        for u in node.inputs:
            k = walk(u, depth + 1)
            if k is None:
                return None
            keys.append(k)
        ops.append((node.op_type, keys, id(v)))
        return id(v) if len(ops) <= _FLAT_MAX_OPS else None

    key = walk(root, 0)
    if key is None or not any(inner[0] == m and rank == 6 for _, rank, inner in leaves.values()):
        return None
    return _FlatLoc(ops=ops, leaves=leaves, root=key)


def _emit_flat_locations(op: Any, em: "_Emitter", flat: _FlatLoc, sizes: dict[Any, Any]) -> Any:
    """The locations (N, Lq, M, L, P, 2) computed as ``flat`` says, in the flat layout."""
    m, levels, points = sizes["m"], sizes["L"], sizes["p"]
    lp2 = levels * points * 2
    made: dict[int, Any] = {}
    for k, (v, rank, inner) in flat.leaves.items():
        if all(d == 1 for d in inner) and rank <= 4:
            made[k] = v  # a scalar or (.., .., 1, 1): broadcasts the same in both layouts
            continue
        x = v
        if rank < 6:
            x = op.Unsqueeze(x, em.ints(list(range(6 - rank))))
        if inner[1:] != (levels, points, 2):
            x = op.Expand(x, em.ints([1, 1, 1, levels, points, 2]))
        made[k] = op.Reshape(x, em.ints([0, 0, inner[0], lp2]))
    for op_type, keys, key in flat.ops:
        made[key] = getattr(op, op_type)(made[keys[0]], made[keys[1]])
    return op.Reshape(made[flat.root], em.ints([0, 0, m, levels, points, 2]))


# --------------------------------------------------------------------------------------------
# Emitting the node
# --------------------------------------------------------------------------------------------


class _Emitter:
    def __init__(self, op: Any, sizes: _Sizes) -> None:
        self.op = op
        self.sizes = sizes
        self._cache: dict[Any, Any] = {}

    def ints(self, values: list[int]) -> Any:
        return self.op.Constant(value_ints=[int(v) for v in values])

    def poly(self, p: Poly) -> Any:
        """A 1-D int64 tensor of one element holding p."""
        if p.is_const():
            return self.ints([cast(int, p.value)])
        key = p
        if key in self._cache:
            return self._cache[key]
        op = self.op
        total = None
        for mono, coef in sorted(p.terms.items()):
            term = None
            for leaf in mono:
                v = self._leaf(leaf)
                term = v if term is None else op.Mul(term, v)
            if term is None:
                term = self.ints([coef])
            elif coef != 1:
                term = op.Mul(term, self.ints([coef]))
            total = term if total is None else op.Add(total, term)
        self._cache[key] = total
        return total

    def _leaf(self, leaf: str) -> Any:
        op = self.op
        kind, value, i = self.sizes.sources[leaf]
        if kind == "dim":
            return op.Gather(op.Shape(value), self.ints([i]), axis=0)
        out = op.Reshape(value, self.ints([1])) if _rank(value) == 0 else op.Gather(value, self.ints([i]), axis=0)
        if value.dtype is not None and value.dtype != _ir().DataType.INT64:
            out = op.Cast(out, to=_ir().DataType.INT64)
        return out

    def canonical(self, src: _Source, roles: tuple[Any, ...], sizes: dict[Any, Any]) -> Any:
        """The source tensor as the op's input with axes ``roles``."""
        op = self.op
        refined: list[tuple[str, Any]] = []  # (role, size to emit: ("axis", i) or int)
        for i, name in enumerate(src.form):
            if name == "C":
                refined += [("m", sizes["m"]), ("d", sizes["d"])]
            elif name == "LP":
                refined += [("l", sizes["L"]), ("p", sizes["p"])]
            elif name == "MLP":
                refined += [("m", sizes["m"]), ("l", sizes["L"]), ("p", sizes["p"])]
            else:
                refined.append((name, ("axis", i)))
        x = src.value
        if len(refined) != len(src.form):
            parts = []
            for j, (_, s) in enumerate(refined):
                if isinstance(s, tuple):
                    # Before the first split the position is the same: Reshape's 0 copies it.
                    parts.append(self.ints([0]) if j == s[1] else
                                 op.Gather(op.Shape(x), self.ints([s[1]]), axis=0))
                else:
                    parts.append(self.ints([s]))
            shape = parts[0] if len(parts) == 1 else op.Concat(*parts, axis=0)
            if all(_const_node_ints(p) is not None for p in parts):
                shape = self.ints([v for p in parts for v in cast("list[int]", _const_node_ints(p))])
            x = op.Reshape(x, shape)
        order = [r for r, _ in refined]
        perm = [order.index(r) for r in roles]
        if perm != list(range(len(perm))):
            x = op.Transpose(x, perm=perm)
        return x


def _const_node_ints(v: Any) -> list[int] | None:
    arr = _const(v)
    return None if arr is None else [int(x) for x in arr.reshape(-1)]


# --------------------------------------------------------------------------------------------
# The rule
# --------------------------------------------------------------------------------------------


def _make_rule_class() -> Any:
    from onnxscript.rewriter import pattern

    ir = _ir()

    class DeformableAttention(pattern.RewriteRuleClassBase):
        """ReduceSum(Mul(samples, weights)) [-> the Reshape/Transpose ops of ``tail``] over
        per-level GridSamples -> ai.opbridge::MultiScaleDeformableAttention [-> the layout the
        chain had]."""

        def __init__(self, session: Any, name: str, tail: tuple[Any, ...]) -> None:
            super().__init__(name=name)
            self.session = session
            self.tail = tail
            self._plan: _Plan | None = None
            self._sizes: _Sizes | None = None

        def pattern(self, op: Any, a: Any, b: Any, axes: Any, s0: Any, s1: Any, s2: Any) -> Any:
            y = op.ReduceSum(op.Mul(a, b, _outputs=["product"]), axes, _outputs=["summed"])
            shapes = iter((s0, s1, s2))
            for i, kind in enumerate(self.tail):
                y = (op.Reshape(y, next(shapes), _outputs=[f"t{i}"]) if kind == "Reshape"
                     else op.Transpose(y, _outputs=[f"t{i}"]))
            return y

        # onnxscript calls check with the pattern's values by name.
        def check(  # type: ignore[override]
                self, context: Any, a: Any, b: Any, axes: Any, product: Any, summed: Any, **kw: Any) -> Any:
            mul, red = product.producer(), summed.producer()
            tail = [kw[f"t{i}"].producer() for i in range(len(self.tail))]
            self._sizes = _Sizes()
            try:
                self._plan = _Analysis(self._sizes).run(mul, red, tail)
                emitted = [p for h, w, st in self._plan.levels for p in (h, w, st)]
                emitted += [self._plan.end] if self._plan.end is not None and not self._plan.covers_all else []
                if any(leaf not in self._sizes.sources for p in emitted if not p.is_const()
                       for term in p.terms for leaf in term):
                    raise _Fail("a level's size is not one the graph computes (the node needs it at run time)")
            except _Fail as e:
                reason = str(e)
                if not self.tail and _feeds_from_grid_sample(mul):
                    for g in _grid_sample_nodes(mul):
                        self.session.reasons.setdefault(id(g), reason)
                return pattern.MatchResult().fail(reason)
            except Exception as e:  # noqa: BLE001 - a model the analysis does not understand is left alone
                return pattern.MatchResult().fail(f"not analysed: {type(e).__name__}: {e}")
            return pattern.MatchResult()

        def rewrite(self, op: Any, a: Any = None, b: Any = None, **_: Any) -> Any:
            # check() set both.
            plan, sizes = cast(_Plan, self._plan), cast(_Sizes, self._sizes)
            em = _Emitter(op, sizes)
            dtype = plan.dtype
            s = plan.sizes
            value = em.canonical(plan.value, ("n", "S", "m", "d"), s)
            if not plan.covers_all:
                value = op.Slice(value, em.ints([0]), em.poly(cast(Poly, plan.end)), em.ints([1]))
            if plan.flat_loc is not None:
                loc = _emit_flat_locations(op, em, plan.flat_loc, s)
            else:
                loc = em.canonical(plan.loc, ("n", "q", "m", "l", "p", "c"), s)
            weights = em.canonical(plan.weights, ("n", "q", "m", "l", "p"), s)
            if plan.loc.value.dtype != dtype:
                loc = op.Cast(loc, to=dtype)
            if plan.weights.value.dtype != dtype:
                weights = op.Cast(weights, to=dtype)
            hw = [x for h, w, _ in plan.levels for x in (h, w)]
            starts = [st for _, _, st in plan.levels]
            if all(p.is_const() for p in hw + starts):
                shapes = op.initializer(ir.tensor(np.array([p.value for p in hw], np.int64).reshape(-1, 2),
                                                  name=self.session.fresh_name("msda.spatial_shapes")),
                                        name=self.session.last_name)
                start_index = op.initializer(ir.tensor(np.array([p.value for p in starts], np.int64),
                                                       name=self.session.fresh_name("msda.level_start_index")),
                                             name=self.session.last_name)
            else:
                shapes = op.Reshape(op.Concat(*[em.poly(p) for p in hw], axis=0), em.ints([-1, 2]))
                start_index = op.Concat(*[em.poly(p) for p in starts], axis=0)
            y = getattr(op, OP_TYPE)(value, shapes, start_index, loc, weights, _domain=DOMAIN)
            return _to_layout(op, em, y, plan.out_axes, s)

    return DeformableAttention


def _to_layout(op: Any, em: _Emitter, y: Any, axes: tuple[Any, ...], sizes: dict[Any, Any]) -> Any:
    """The op's output (N, Lq, M·D) in the layout the replaced value had (axes of roles; a batch
    of static size 1 may be left out)."""
    if axes == (("n",), ("q",), ("m", "d")):
        return y
    flat = [r for ax in axes for r in ax]
    lead = [] if "n" in flat else ["n"]
    order = ["n", "q", "m", "d"]
    y = op.Reshape(y, em.ints([0, 0, sizes["m"], sizes["d"]]))
    perm = [order.index(r) for r in lead + flat]
    if perm != list(range(4)):
        y = op.Transpose(y, perm=perm)
    if not lead and all(len(ax) == 1 for ax in axes) and len(axes) == 4:
        return y
    static = {"m": sizes["m"], "d": sizes["d"]}
    parts = [int(np.prod([static[r] for r in ax])) if all(r in static for r in ax) else None for ax in axes]
    if parts.count(None) <= 1:
        return op.Reshape(y, em.ints([-1 if p is None else p for p in parts]))
    shape = op.Shape(y)
    pieces, pos = [], len(lead)
    for ax, p in zip(axes, parts):
        if p is not None:
            pieces.append(em.ints([p]))
        else:
            v = op.Gather(shape, em.ints([pos]), axis=0)
            for k in range(1, len(ax)):
                v = op.Mul(v, op.Gather(shape, em.ints([pos + k]), axis=0))
            pieces.append(v)
        pos += len(ax)
    return op.Reshape(y, op.Concat(*pieces, axis=0))


def _grid_sample_nodes(mul: Any) -> list[Any]:
    out = []
    for v in mul.inputs:
        for _, node in _back(v, False):
            if node is not None and node.op_type == "Concat":
                for u in node.inputs:
                    g = _back(u, False)[-1][1]
                    if g is not None and g.op_type == "GridSample":
                        out.append(g)
            elif node is not None and node.op_type == "GridSample":
                out.append(node)
    return out


def _feeds_from_grid_sample(mul: Any) -> bool:
    return bool(_grid_sample_nodes(mul))


class Session:
    """Names and reasons shared by the rules of one rewrite."""

    def __init__(self, graph_names: Iterable[str] = ()) -> None:
        self.reasons: dict[int, str] = {}
        self._names = set(graph_names)
        self.last_name = ""

    def fresh_name(self, hint: str) -> str:
        name, i = hint, 1
        while name in self._names:
            name, i = f"{hint}_{i}", i + 1
        self._names.add(name)
        self.last_name = name
        return name


# The data-movement ops after the sum that a rule takes into the rewrite, so that the node's output
# goes straight to the layout the model reads next (where that is the op's own, no op at all):
# the function's view + transpose, and the dynamo exporter's extra Reshape between them.
_TAILS = (("Reshape", "Reshape", "Transpose"), ("Reshape", "Transpose"), ("Reshape",), ())


def rules(session: Session) -> list[Any]:
    """The rules, longest form first (each shorter one matches a prefix of a longer one): each is
    applied to the whole model in turn."""
    cls = _make_rule_class()
    return [cls.rule(session, f"opbridge.ms_deform_attn.{len(t)}{''.join(k[0] for k in t)}", t) for t in _TAILS]


def finish(model: Any) -> None:
    """After a rewrite: the domain imported at the op's version."""
    imports = model.graph.opset_imports
    imports[DOMAIN] = max(int(imports.get(DOMAIN, DOMAIN_VERSION)), DOMAIN_VERSION)


def leftovers(model: Any, session: Session) -> list[str]:
    """A note per GridSample still in the graph (after unused nodes were removed), with the reason
    its chain was not rewritten."""
    notes = []
    for node in model.graph:
        if node.op_type == "GridSample" and node.domain in ("", "ai.onnx"):
            reason = session.reasons.get(id(node), "not part of a recognised multi-scale deformable attention "
                                                    "(its samples are not weighted and summed by a Mul and a "
                                                    "ReduceSum)")
            notes.append(f"{_label(node)}: {NOT_REWRITTEN}: {reason}")
    return notes


# --------------------------------------------------------------------------------------------
# A runnable reference for the check
# --------------------------------------------------------------------------------------------


def make_grid_samples_runnable(model: Any) -> int:
    """Gives every GridSample of ``model`` (an onnx_ir Model) whose input types ONNX Runtime's CPU
    kernels lack -- a float16 image, or a float64 grid with a float32 image as the TorchScript
    exporter writes for transformers' models -- float32 inputs (Casts in front) and casts its
    result back: what torch computed, in float32 (torch's grid_sample takes one type for both).
    The check of ``opbridge optimize`` runs such an original this way. Returns how many changed."""
    from ._shapes import infer_shapes_ir

    ir = _ir()
    infer_shapes_ir(model)  # the types of the GridSample inputs
    f32, f64 = ir.DataType.FLOAT, ir.DataType.DOUBLE
    changed = 0
    graph = model.graph
    for node in list(graph):
        if node.op_type != "GridSample" or node.domain not in ("", "ai.onnx"):
            continue
        x, grid = node.inputs[0], node.inputs[1]
        if x.dtype is None or grid.dtype is None or (x.dtype, grid.dtype) in ((f32, f32), (f64, f64)):
            continue
        for i, v in enumerate((x, grid)):
            if v.dtype != f32:
                cast = ir.Node("", "Cast", [v], attributes=[ir.AttrInt64("to", f32)], name=f"{node.name}/in{i}_f32")
                graph.insert_before(node, cast)
                node.replace_input_with(i, cast.outputs[0])
        out = node.outputs[0]
        uses = list(out.uses())
        back = ir.Node("", "Cast", [out], attributes=[ir.AttrInt64("to", x.dtype)], name=f"{node.name}/out")
        graph.insert_after(node, back)
        result = back.outputs[0]
        for use in uses:
            use.node.replace_input_with(use.idx, result)
        name = out.name
        out.name = f"{name}/f32"
        result.name = name
        # The output is float32 now: a float16 type inferred for it earlier would be written into
        # the copy's value_info, which ORT checks against the kernel's (a float16 image).
        result.shape, result.dtype = out.shape, x.dtype
        out.dtype = f32
        for k, o in enumerate(graph.outputs):
            if o is out:
                graph.outputs[k] = result
        changed += 1
    return changed


def runnable_original(path: str, folder: str) -> str | None:
    """A copy of the model at ``path``, written into ``folder``, with make_grid_samples_runnable
    applied; None when it has no such GridSample. Tensors kept in external data stay there (the
    copy's data file is written one tensor at a time)."""
    import os

    ir = _ir()
    model = ir.load(path)
    if not make_grid_samples_runnable(model):
        return None
    out = os.path.join(folder, "original-float32-grid-sample.onnx")
    external = any(isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values())
    if external:
        ir.save(model, out, external_data=os.path.basename(out) + ".data")
    else:
        ir.save(model, out)
    return out
