"""Fuzz cases for Inverse: ai.opbridge::Inverse in ORT and torch.ops.opbridge.inverse.

Tolerance (the documented accuracy): for a matrix A of condition number k = cond_2(A), the
inverse X must satisfy, elementwise,

    |X - X_ref| <= 10 * n * k * eps(dtype) * max|X_ref|

with X_ref the float64 inverse of the same values (numpy/LAPACK), eps 2^-24 (float32) or 2^-53
(float64): the classic normwise bound of an LU-based inverse, applied per element. Where that
bound exceeds 10% (CHECKED_LIMIT) the inverse carries no reliable digit of the type: any result,
or the singular-matrix error, is accepted (values unchecked). Matrices that are exactly singular by construction (a
zero row or column, a row repeated or repeated times a power of two) must give the singular
error; NaN in a matrix gives an all-NaN inverse; inf in a matrix gives unspecified values or the
singular error (never a crash).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from onnx import TensorProto, helper


from .. import oracle
from .. import strategies as S
from ..harness import Case

OP = "inverse"
OP_TYPE = "Inverse"  # the ONNX op type (kInverseOpType / opbridge.onnx.inverse)
DOMAIN = "ai.opbridge"

TYPES = ("float32", "float64")
EPS = {"float32": 2.0**-24, "float64": 2.0**-53}
MAX_NUMEL = 4096
# Largest relative bound 10 n k eps for which values are checked (see the module docstring).
CHECKED_LIMIT = 0.1
SIZES = (0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 24, 33)

RULES = {
    "rank": r"x must have rank >= 2 \(a batch of square matrices, shape \(\*, n, n\)\), got rank \d+",
    "square": r"x must hold square matrices \(\*, n, n\), got matrices of shape \(\d+, \d+\)",
    "singular": r"matrix \d+ of the batch is singular \(U\[\d+,\d+\] == 0\)",
    "x_dtype": r"x must be a float32 or float64 tensor, got \S+",
}
LABEL = {"ort": r"ai\.opbridge::Inverse( \(node '[^']*'\))?: ", "torch": r"opbridge::inverse: "}
# torch raises torch.linalg.LinAlgError for a singular matrix, TypeError for a dtype.
TORCH_TYPES = {"singular": "_LinAlgError", "x_dtype": "TypeError"}


def _error(kind, rules, ort=()):
    patterns = [LABEL[kind] + RULES[r] for r in rules] + [oracle.ORT_CLEAR[k] for k in ort]
    types = tuple(sorted({TORCH_TYPES.get(r, "ValueError") for r in rules})) if kind == "torch" else ()
    return oracle.Error(patterns, why=", ".join(list(rules) + list(ort)), types=types)


# ------------------------------------------------------------------------------ matrices
MATRIX_KINDS = ("normal", "normal", "normal", "dominant", "ill", "hilbert", "diag_scaled", "scaled",
                "zero_row", "zero_col", "dup_row", "pow2_row", "nan", "inf")
SINGULAR = {"zero_row", "zero_col", "dup_row", "pow2_row"}


def _matrix(rng, kind, n, dtype):
    """One n x n matrix of `kind` as float64 values exactly representable in dtype."""
    if kind == "dominant":
        a = rng.standard_normal((n, n)) + 2 * n * np.eye(n)
    elif kind == "ill":
        # U diag(s) V^T with singular values spread over up to 10^(digits of the type).
        top = {"float32": 7, "float64": 15}[dtype]
        s = np.logspace(0, -rng.uniform(1, top), n) if n else np.ones(0)
        u, _ = np.linalg.qr(rng.standard_normal((n, n)))
        v, _ = np.linalg.qr(rng.standard_normal((n, n)))
        a = (u * s) @ v.T
    elif kind == "hilbert":
        i = np.arange(n)
        a = 1.0 / (i[:, None] + i[None, :] + 1)
    elif kind == "diag_scaled":
        lim = {"float32": 15, "float64": 100}[dtype]
        a = np.diag(10 ** rng.uniform(-lim, lim, n)) + 1e-3 * np.triu(rng.standard_normal((n, n)), 1)
    elif kind == "scaled":
        lim = {"float32": 15, "float64": 100}[dtype]
        a = rng.standard_normal((n, n)) * 10 ** rng.uniform(-lim, lim)
    else:
        a = rng.standard_normal((n, n))
    a = S.as_dtype(a, dtype).astype(np.float64)
    if n >= 1 and kind in SINGULAR:
        i = int(rng.integers(n))
        if kind == "zero_row":
            a[i] = 0
        elif kind == "zero_col":
            a[:, i] = 0
        elif n >= 2:
            j = (i + 1 + int(rng.integers(n - 1))) % n
            a[j] = a[i] * (1 if kind == "dup_row" else 2.0 ** int(rng.integers(-3, 4)))
        else:
            a[0, 0] = 0
    if n >= 1 and kind in ("nan", "inf"):
        a[rng.integers(n), rng.integers(n)] = np.nan if kind == "nan" else rng.choice([np.inf, -np.inf])
    return a


def _batch(draw, rng, batch_shape, n, dtype):
    """Matrices of batch_shape + (n, n): mostly one kind, sometimes one odd matrix among normal
    ones. Returns (values, kinds per matrix, note)."""
    count = int(np.prod(batch_shape, dtype=np.int64))
    kind = draw(st.sampled_from(MATRIX_KINDS))
    odd_one = count > 1 and draw(S.chance(1, 2))
    kinds = ["normal"] * count if odd_one else [kind] * count
    if odd_one:
        kinds[int(rng.integers(count))] = kind
    mats = [_matrix(rng, k, n, dtype) for k in kinds]
    x = np.array(mats).reshape(tuple(batch_shape) + (n, n)) if count else np.zeros(tuple(batch_shape) + (n, n))
    return x, kinds, f"{kind}{' (one matrix)' if odd_one else ''}"


def _expected(x, kinds, dtype):
    """(Ok, may_fail) for a valid-shaped float x (batch..., n, n), or None when some matrix is
    exactly singular by construction (the singular error is then required)."""
    n = x.shape[-1]
    flat = x.reshape(-1, n, n)
    finite = [bool(np.isfinite(a).all()) for a in flat]
    if any(k in SINGULAR and f for k, f in zip(kinds, finite)):
        return None
    ref = np.zeros_like(flat)
    allowed = np.zeros_like(flat)
    unchecked = np.zeros(flat.shape, bool)
    may_fail = False
    for b, (a, kind, fin) in enumerate(zip(flat, kinds, finite)):
        if kind == "nan" and not np.isinf(a).any():
            ref[b] = np.nan  # a NaN pivot wins the search and spreads to every entry
            continue
        cond = np.linalg.cond(a) if fin and n else (1.0 if fin else np.inf)
        bound = 10 * n * cond * EPS[dtype]
        if not np.isfinite(bound) or bound > CHECKED_LIMIT:
            # inf in the matrix, or no digits left in the type: any values, or "singular".
            unchecked[b] = True
            may_fail = True
            continue
        ref[b] = np.linalg.inv(a)
        allowed[b] = bound * np.abs(ref[b]).max()
    exp = oracle.Expected(ref.reshape(x.shape), dtype, allowed.reshape(x.shape), unchecked=unchecked.reshape(x.shape))
    return oracle.Ok([exp]), may_fail


# ------------------------------------------------------------------------------ ORT
ORT_ASPECTS = ("x_type", "structure", "feeds", "rank", "square")


@st.composite
def _shape(draw, rank, square=True):
    n = draw(st.sampled_from(SIZES))
    cols = n if square else draw(st.sampled_from([c for c in (0, 1, 2, 3, 5) if c != n]))
    batch = []
    for _ in range(rank - 2):
        batch.append(draw(S.weighted((6, 1), (4, 2), (3, 3), (1, 0), (1, 5))))
    while np.prod(batch + [n, cols], dtype=np.int64) > MAX_NUMEL and any(d > 1 for d in batch):
        k = int(np.argmax(batch))
        batch[k] //= 2
    return tuple(batch), n, cols


@st.composite
def ort_cases(draw):
    seed = draw(S.seeds())
    rng = np.random.default_rng(seed)
    broken = draw(S.broken_aspects(ORT_ASPECTS))
    x_type = draw(st.sampled_from(sorted(set(S.ONNX_TYPES) - set(TYPES))) if "x_type" in broken
                  else st.sampled_from(TYPES))
    dtype = x_type if x_type in TYPES else "float64"
    rank = draw(st.sampled_from([0, 1]) if "rank" in broken else S.weighted((3, 2), (3, 3), (2, 4), (1, 5)))
    structure = draw(st.sampled_from(["extra_input", "missing_x"]) if "structure" in broken else st.just("normal"))
    feed_mode = draw(st.sampled_from(["missing_feed", "extra_feed", "wrong_feed_dtype", "absurd_declared"])
                     if "feeds" in broken else st.just("exact"))
    declared = draw(st.sampled_from(["unknown", "symbolic", "static"]))
    threads = draw(st.sampled_from([None, 1, 2]))
    node_name = draw(S.weighted((2, ""), (1, "inv_3")))
    huge = rank >= 3 and draw(S.chance(1, 12))
    if huge and feed_mode == "absurd_declared":
        # X comes from ConstantOfShape here; declaring its shape input absurd ([2^62] elements)
        # makes ORT itself allocate for ~1 minute before failing (bad_alloc): not our op's case.
        feed_mode = "missing_feed"

    rules, ort_errors, note = [], [], ""
    nodes, graph_inputs, feeds = [], [], {}
    if rank < 2:
        shape = tuple(draw(st.sampled_from(range(5))) for _ in range(rank))
        x = rng.standard_normal(shape)
        kinds, note = [], "rank < 2"
        rules.append("rank")
    elif huge:
        # Empty x with enormous dims: n * n may overflow int64 (n = 2^32 made it 0, a division
        # by zero). ORT itself refuses shapes whose running element count overflows.
        n = draw(st.sampled_from([0, 1, 2**31, 2**32, 2**62]))
        batch = [draw(st.sampled_from([0, 1, 3, 2**31, 2**62])) for _ in range(rank - 2)]
        if n != 0:
            batch[draw(st.sampled_from(range(rank - 2)))] = 0
        cols = n if "square" not in broken else n + 1
        shape = tuple(batch) + (n, cols)
        x, kinds, note = None, [], "x empty, huge dims"
        if cols != n:
            rules.append("square")
    else:
        batch, n, cols = draw(_shape(rank, square="square" not in broken))
        shape = batch + (n, cols)
        if cols != n:
            rules.append("square")
            x, kinds = rng.standard_normal(shape), []
            note = "not square"
        else:
            x, kinds, note = _batch(draw, rng, batch, n, dtype)

    def dshape(s):
        if feed_mode == "absurd_declared":
            return [2**62, 2**62] if len(s) != 2 else [2**62, 2**62, 3]
        return {"unknown": None, "symbolic": [f"d{i}" for i in range(len(s))], "static": list(s)}[declared]

    if x is None:  # huge: ConstantOfShape -> Inverse -> Shape
        graph_inputs.append(helper.make_tensor_value_info("x_shape", TensorProto.INT64, [len(shape)]))
        feeds["x_shape"] = np.array(shape, np.int64)
        vt = S.onnx_type(x_type) if x_type in TYPES else TensorProto.FLOAT
        nodes.append(helper.make_node("ConstantOfShape", ["x_shape"], ["X0"],
                                      value=helper.make_tensor("v", vt, [1], [1.0])))
        nodes.append(helper.make_node("Cast", ["X0"], ["X"], to=S.onnx_type(x_type)))
    elif S.ONNX_TYPES[x_type][1] is None:
        graph_inputs.append(helper.make_tensor_value_info("X_f", TensorProto.FLOAT, dshape(shape)))
        with np.errstate(over="ignore"):
            feeds["X_f"] = np.asarray(x, np.float32)
        nodes.append(helper.make_node("Cast", ["X_f"], ["X"], to=S.onnx_type(x_type)))
    else:
        graph_inputs.append(helper.make_tensor_value_info("X", S.onnx_type(x_type), dshape(shape)))
        feeds["X"] = S.feed_array(np.asarray(x), x_type)
    node_inputs = {"normal": ["X"], "extra_input": ["X", "X"], "missing_x": [""]}[structure]
    nodes.append(helper.make_node(OP_TYPE, node_inputs, ["Y"], domain=DOMAIN, name=node_name))
    out_name, out_type = "Y", x_type
    if x is None:
        nodes.append(helper.make_node("Shape", ["Y"], ["Y_shape"]))
        out_name, out_type = "Y_shape", "int64"
    graph = helper.make_graph(nodes, "fuzz_inverse", graph_inputs,
                              [helper.make_tensor_value_info(out_name, S.onnx_type(out_type), None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)],
                              ir_version=10)

    names = list(feeds)
    if feed_mode == "missing_feed":
        del feeds[names[-1]]
        ort_errors.append("feed_missing")
    elif feed_mode == "extra_feed":
        feeds["not_an_input"] = np.zeros(1, np.float32)
        ort_errors.append("feed_name")
    elif feed_mode == "wrong_feed_dtype" and feeds[names[0]].dtype != object:
        with np.errstate(over="ignore", invalid="ignore"):
            feeds[names[0]] = feeds[names[0]].astype(np.float32 if feeds[names[0]].dtype == np.float64 else np.float64)
        ort_errors.append("feed_type")
    elif feed_mode == "absurd_declared":
        ort_errors += ["feed_rank", "feed_dims"]
    if structure == "extra_input":
        ort_errors.append("arity")
    if structure == "missing_x":
        ort_errors += ["empty_required", "arity"]
    if x_type not in TYPES:
        ort_errors += ["type", "no_kernel", "unsupported_type", "type_mismatch"]
    if x is None and S.left_to_right_overflows(shape):
        ort_errors.append("shape_overflow")

    desc = (f"x{list(shape)} {x_type} {note} {structure} feeds={feed_mode} declared={declared} "
            f"threads={threads} seed={seed}")
    payload = {"kind": "ort", "model": model.SerializeToString(), "feeds": feeds, "threads": threads}
    if rules or ort_errors:
        return Case(OP, "ort", desc, payload, _error("ort", rules, ort_errors))
    if x is None:
        return Case(OP, "ort", desc, payload,
                    oracle.Ok([oracle.Expected(np.array(shape, np.float64), "int64", 0.0)], why="empty x"))
    if x.size == 0:
        return Case(OP, "ort", desc, payload, oracle.Ok([oracle.Expected(np.zeros(shape), x_type, 0.0)], why="empty x"))
    got = _expected(x, kinds, dtype)
    if got is None:
        return Case(OP, "ort", desc, payload, _error("ort", ["singular"]))
    ok, may_fail = got
    expect = oracle.Either(ok, _error("ort", ["singular"])) if may_fail else ok
    return Case(OP, "ort", desc, payload, expect)


# ------------------------------------------------------------------------------ torch
TORCH_ASPECTS = ("x_dtype", "rank", "square")


@st.composite
def torch_cases(draw):
    seed = draw(S.seeds())
    rng = np.random.default_rng(seed)
    broken = draw(S.broken_aspects(TORCH_ASPECTS))
    dtype = draw(st.sampled_from(["float16", "bfloat16", "int32", "int64", "bool", "complex64"])
                 if "x_dtype" in broken else st.sampled_from(TYPES))
    vdtype = dtype if dtype in TYPES else "float64"
    rank = draw(st.sampled_from([0, 1]) if "rank" in broken else S.weighted((3, 2), (3, 3), (2, 4), (1, 5)))
    device = draw(S.weighted((12, "cpu"), (1, "meta")))
    rules = []
    if "x_dtype" in broken:
        rules.append("x_dtype")
    if rank < 2:
        shape = tuple(draw(st.sampled_from(range(5))) for _ in range(rank))
        x, kinds, note = rng.standard_normal(shape), [], "rank < 2"
        rules.append("rank")
    else:
        batch, n, cols = draw(_shape(rank, square="square" not in broken))
        shape = batch + (n, cols)
        if cols != n:
            rules.append("square")
            x, kinds, note = rng.standard_normal(shape), [], "not square"
        else:
            x, kinds, note = _batch(draw, rng, batch, n, vdtype)
    grad = (not rules and device == "cpu" and rank >= 2 and shape[-1] >= 1 and draw(S.chance(1, 4)))
    if grad:
        # Gradients need a well-conditioned matrix (their error grows with cond^2).
        x = np.array([_matrix(rng, "dominant", shape[-1], vdtype) for _ in range(int(np.prod(shape[:-2])))])
        x = x.reshape(shape)
        kinds, note = ["dominant"] * int(np.prod(shape[:-2])), "dominant (gradient)"
    layout = draw(S.layouts(shape))
    if grad and isinstance(layout, tuple) and layout[0] == "expand":
        layout = "contiguous"  # equal rows or columns would make the gradient case singular
    if isinstance(layout, tuple) and layout[0] == "expand":
        d = layout[1]
        x = np.broadcast_to(np.take(x, [0], axis=d), shape).copy()
        if rank >= 2 and kinds:
            if d == rank - 2:
                kinds = ["dup_row" if shape[-1] > 1 else k for k in kinds]  # equal rows: singular
            elif d == rank - 1:
                kinds = ["expanded_cols"] * len(kinds)  # equal columns: judged by cond
            else:  # a batch dim: copies of the matrices at index 0 along it
                kb = np.array(kinds, dtype=object).reshape(shape[:-2])
                kinds = np.broadcast_to(np.take(kb, [0], axis=d), shape[:-2]).ravel().tolist()
    data = x if dtype in TYPES else S.feed_array(np.asarray(x), dtype if dtype != "complex64" else "float32")
    if dtype == "complex64":
        with np.errstate(over="ignore", invalid="ignore"):
            data = np.asarray(x).astype(np.complex64)
    if dtype in ("float16", "bfloat16"):
        data = np.asarray(x)
    x_spec = S.tensor_spec(data, dtype, layout, device, grad)
    grad_spec = None
    if grad:
        grad_spec = S.tensor_spec(S.as_dtype(rng.standard_normal(shape), vdtype).astype(np.float64), vdtype)
    desc = f"x{list(shape)} {dtype} {layout} {device} {note} grad={grad} seed={seed}"
    payload = {"kind": "torch", "op": OP, "args": [x_spec], "grad": grad_spec}
    if rules:
        return Case(OP, "torch", desc, payload, _error("torch", rules))
    if device == "meta" or int(np.prod(shape)) == 0:
        return Case(OP, "torch", desc, payload,
                    oracle.Ok([oracle.Expected(None, dtype, shape=shape)], why="meta or empty"))
    got = _expected(x, kinds, vdtype)
    if got is None:
        return Case(OP, "torch", desc, payload, _error("torch", ["singular"]))
    ok, may_fail = got
    if grad and not may_fail:
        # dL/dA = -A^-T G A^-T
        y = np.linalg.inv(x)
        yt = np.swapaxes(y, -1, -2)
        dx = -(yt @ grad_spec["data"] @ yt)
        scale = np.abs(dx).max(axis=(-2, -1), keepdims=True) * shape[-1]
        tol = {"float32": 1e-5, "float64": 1e-12}[vdtype]
        ok.outputs = list(ok.outputs) + [oracle.Expected(dx, vdtype, tol * scale + 1e-300)]
    expect = oracle.Either(ok, _error("torch", ["singular"])) if may_fail else ok
    return Case(OP, "torch", desc, payload, expect)
