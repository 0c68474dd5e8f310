"""Fuzz cases for the point-cloud ops (one family, one module): FurthestPointSample, GatherPoints,
BallQuery, KNN, GroupingOperation, ThreeNN and ThreeInterpolate in ORT, and the torch ops
torch.ops.opbridge.<op> (with gradients, and on the meta device: the fake kernels).

Every case draws one of the seven ops. Point coordinates are multiples of 1/16 in [-2, 2] times a
power of two: every squared distance is then exact in each dtype's compute type (float for the
16-bit types), so the indices must equal the float64 reference's exactly (ties to the lowest
index, a NaN distance counting as +infinity: docs/point_cloud.md); the grid makes ties common.
Some clouds hold NaN or infinite coordinates, some are empty. Float outputs are compared with
the float64 reference: gathers exactly, three_nn's distances within a few units of the output
type's rounding, three_interpolate and the backward scatter-adds within the rounding of a sum of
their terms' magnitudes. Invalid cases (k or num_points out of range, k > N, empty clouds to
query, radius <= 0, indices out of range, int32 or mismatched dtypes, wrong ranks or dims) must be
refused with the declaration's message, the same in ORT (an error naming the node), torch and the
fake kernel (which cannot see index values: there those cases are valid).
"""

from __future__ import annotations

import os

import numpy as np
from hypothesis import strategies as st
from onnx import TensorProto, helper

from .. import oracle
from .. import strategies as S
from ..harness import Case

OP = "point_cloud"
DOMAIN = "ai.opbridge"
FLOATS = S.FLOAT_TYPES
INDEX_TYPES = ("int64", "int32")
# Rounding unit of each output type, and of the type each is computed in.
EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
ACC_EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-24, "bfloat16": 2.0**-24}
FLOAT_LIST = "float32, float64, float16 or bfloat16"

# name: (ONNX type, tensor inputs (name, type variable), attributes, outputs (name, type variable))
OPS = {
    "furthest_point_sample": ("FurthestPointSample", [("points_xyz", "T")], ["num_points"], [("indices", "I")]),
    "gather_points": ("GatherPoints", [("features", "T"), ("indices", "J")], [], [("output", "T")]),
    "ball_query": ("BallQuery", [("xyz", "T"), ("center_xyz", "T")], ["min_radius", "max_radius", "sample_num"],
                   [("indices", "I")]),
    "knn": ("KNN", [("xyz", "T"), ("center_xyz", "T")], ["k"], [("indices", "I")]),
    "grouping_operation": ("GroupingOperation", [("features", "T"), ("indices", "J")], [], [("output", "T")]),
    "three_nn": ("ThreeNN", [("target", "T"), ("source", "T")], [], [("dist", "T"), ("indices", "I")]),
    "three_interpolate": ("ThreeInterpolate", [("features", "T"), ("indices", "J"), ("weight", "T")], [],
                          [("output", "T")]),
}
# The differentiable inputs of each op (the declared backward ops).
GRADS = {"gather_points": ["features"], "grouping_operation": ["features"],
         "three_interpolate": ["features", "weight"]}
SHAPE_DOC = {"points_xyz": "(B, N, 3)", "xyz": "(B, N, 3)", "center_xyz": "(B, M, 3)", "target": "(B, N, 3)",
             "source": "(B, M, 3)", "weight": "(B, N, 3)"}
SHAPE_DOC_BY_OP = {("gather_points", "features"): "(B, C, N)", ("gather_points", "indices"): "(B, M)",
                   ("grouping_operation", "features"): "(B, C, N)", ("grouping_operation", "indices"): "(B, M, S)",
                   ("three_interpolate", "features"): "(B, C, M)", ("three_interpolate", "indices"): "(B, N, 3)"}
N_ = r"-?\d+"


def _rank_rule(op, name):
    doc = SHAPE_DOC_BY_OP.get((op, name), SHAPE_DOC.get(name, ""))
    rank = 2 if (op, name) == ("gather_points", "indices") else 3
    return rf"{name} must have rank {rank} {_re(doc)}, got rank \d+"


def _re(s):
    return s.replace("(", r"\(").replace(")", r"\)")


def rule(op, what, names=("",)):
    """The declaration's message for one broken aspect (a regex); `names`: the arguments it may
    name (the first failing check wins, so any input of the type variable)."""
    if len(names) > 1:
        return "(?:" + "|".join(rule(op, what, (n,)) for n in names) + ")"
    name = names[0]
    return {
        "float_dtype": rf"{name} must be a {FLOAT_LIST} tensor, got \w+",
        "index_dtype": r"indices must be an int64 or int32 tensor, got \w+",
        "same_dtype": rf"{name} must have the dtype of \w+ \(\w+\), got \w+",
        "rank": _rank_rule(op, name),
        "last_dim": rf"{name} must have shape \(B, [\w*], 3\), got {name}\.shape\[2\] = \d+" if op != "three_interpolate" else
                    r"indices must have shape \(B, N, 3\), got shape \[.*\]",
        "batch": {"ball_query": rf"center_xyz must have B = xyz.shape\[0\] = {N_} clouds, got center_xyz.shape\[0\] = {N_}",
                  "knn": rf"center_xyz must have B = xyz.shape\[0\] = {N_} clouds, got center_xyz.shape\[0\] = {N_}",
                  "three_nn": rf"source must have B = target.shape\[0\] = {N_} clouds, got source.shape\[0\] = {N_}",
                  "three_interpolate": rf"indices must have B = features.shape\[0\] = {N_} rows, got shape \[.*\]",
                  }.get(op, rf"indices must have B = features.shape\[0\] = {N_} rows, got indices.shape\[0\] = {N_}"),
        "num_points_neg": rf"num_points must be >= 0, got {N_}",
        "num_points_big": rf"num_points must be <= N = points_xyz.shape\[1\] = {N_}, got num_points = {N_}",
        "max_radius": r"max_radius must be > 0, got \S+",
        "min_radius": r"min_radius must be >= 0 and < max_radius = \S+, got \S+",
        "sample_num": rf"sample_num must be >= 1, got {N_}",
        "empty_xyz": r"xyz must hold at least one point \(N >= 1\) for its centers, got N = 0",
        "k_small": rf"k must be >= 1, got {N_}",
        "k_big": rf"k must be <= N = xyz.shape\[1\] = {N_}, got k = {N_}",
        "source_small": rf"source must hold at least 3 points \(M >= 3\), got source.shape\[1\] = {N_}",
        "index_range": (rf"indices\[[\d, ]+\] = {N_} is outside \[0, "
                        + ("M" if op == "three_interpolate" else "N") + rf" = features.shape\[2\] = {N_}\)"),
        "weight_shape": r"weight must have the shape of indices \[.*\], got shape \[.*\]",
        "empty_features": r"features must have [MN] >= 1 points to (interpolate|gather) from, got features.shape\[2\] = 0",
    }[what]


def _label(kind, op):
    if kind == "ort":
        return rf"ai\.opbridge::{OPS[op][0]}( \(node '[^']*'\))?: "
    return rf"opbridge::{op}: "


TYPE_RULES = {"float_dtype", "index_dtype", "same_dtype"}


def _error(kind, op, rules, inputs=(), ort=()):
    """Any of `rules` (aspect names), or ORT's own refusals `ort`."""
    patterns = [_label(kind, op) + rule(op, r, _name(op, r, inputs)) for r in rules]
    patterns += [oracle.ORT_CLEAR[k] for k in ort]
    types = ()
    if kind == "torch":
        types = tuple(sorted({"TypeError" if r in TYPE_RULES else "ValueError" for r in rules}))
    return oracle.Error(patterns, why=", ".join(rules) + (" " + ", ".join(ort) if ort else ""), types=types)


# ------------------------------------------------------------------------------ data
def _cloud(rng, b, n, dtype, scale, specials):
    """(b, n, 3) grid coordinates: multiples of scale/16 in [-2 scale, 2 scale]; exact in dtype."""
    a = rng.integers(-32, 33, size=(b, n, 3)) / 16.0 * scale
    if specials and a.size:
        a = S.inject_specials(rng, a, int(rng.integers(1, 4)))
        if specials == "nan":
            a[np.isinf(a)] = np.nan
    return a


def _features(rng, shape, dtype, specials):
    a = S.as_dtype(rng.standard_normal(shape) * 2.0, dtype).astype(np.float64)
    if specials and a.size:
        a = S.inject_specials(rng, a, int(rng.integers(1, 3)))
    return a


def _sq(a, b):
    """Squared distances (len(a), len(b)) in float64; NaN counts as +inf (as documented)."""
    with np.errstate(invalid="ignore", over="ignore"):
        d = a[:, None, :] - b[None, :, :]
        d = (d * d).sum(-1)
    return np.where(np.isnan(d), np.inf, d)


def ref_fps(xyz, m):
    out = np.zeros((xyz.shape[0], m))
    for b in range(xyz.shape[0]):
        best = np.full(xyz.shape[1], np.inf)
        last = 0
        for j in range(1, m):
            best = np.minimum(best, _sq(xyz[b, last:last + 1], xyz[b])[0])
            last = int(np.argmax(best))
            out[b, j] = last
    return out


def ref_ball_query(lo, hi, s, xyz, centers):
    lo2, hi2 = float(np.float32(lo)) ** 2, float(np.float32(hi)) ** 2
    out = np.zeros((centers.shape[0], centers.shape[1], s))
    for b in range(centers.shape[0]):
        d = _sq(centers[b], xyz[b])
        for m in range(centers.shape[1]):
            hits = np.flatnonzero((d[m] == 0) | ((d[m] >= lo2) & (d[m] < hi2)))[:s]
            if hits.size:
                out[b, m] = np.concatenate([hits, np.full(s - hits.size, hits[0])])
    return out


def ref_knn(k, xyz, centers):
    out = np.zeros((xyz.shape[0], k, centers.shape[1]))
    for b in range(xyz.shape[0]):
        out[b] = np.argsort(_sq(centers[b], xyz[b]), axis=1, kind="stable")[:, :k].T
    return out


def ref_three_nn(target, source):
    dist = np.zeros(target.shape[:2] + (3,))
    idx = np.zeros(target.shape[:2] + (3,))
    for b in range(target.shape[0]):
        d = _sq(target[b], source[b])
        order = np.argsort(d, axis=1, kind="stable")[:, :3]
        idx[b] = order
        dist[b] = np.sqrt(np.take_along_axis(d, order, axis=1))
    return dist, idx


def ref_gather(features, indices):
    out = np.zeros(features.shape[:2] + indices.shape[1:])
    for b in range(features.shape[0]):
        out[b] = features[b][:, indices[b].astype(np.int64)]
    return out


def ref_three_interpolate(features, indices, weight):
    """(output, sum of the terms' magnitudes)."""
    out = np.zeros(features.shape[:2] + (indices.shape[1],))
    mag = np.zeros_like(out)
    with np.errstate(invalid="ignore", over="ignore"):
        for b in range(features.shape[0]):
            for j in range(3):
                term = features[b][:, indices[b, :, j].astype(np.int64)] * weight[b, :, j]
                out[b] += term
                mag[b] += np.abs(term)
    return out, mag


def _scatter(shape, indices, grad):
    """features-shaped sum of grad over indices (the gathers' backward) and of |grad|."""
    g = np.zeros(shape)
    mag = np.zeros(shape)
    flat = indices.reshape(indices.shape[0], -1).astype(np.int64)
    gg = grad.reshape(grad.shape[0], grad.shape[1], -1)
    for b in range(shape[0]):
        for c in range(shape[1]):
            np.add.at(g[b, c], flat[b], gg[b, c])
            np.add.at(mag[b, c], flat[b], np.abs(gg[b, c]))
    return g, mag


def _sum_allowance(mag, terms, dtype):
    """Rounding of a sum of `terms` products accumulated in the compute type, then rounded once to
    dtype."""
    return (terms + 2) * ACC_EPS[dtype] * mag + EPS[dtype] * mag + 1e-300


# ------------------------------------------------------------------------------ one case
ASPECTS = {
    "furthest_point_sample": ("float_dtype", "rank", "last_dim", "num_points_neg", "num_points_big"),
    "gather_points": ("float_dtype", "index_dtype", "rank", "batch", "index_range", "empty_features"),
    "ball_query": ("float_dtype", "same_dtype", "rank", "last_dim", "batch", "max_radius", "min_radius", "sample_num",
                   "empty_xyz"),
    "knn": ("float_dtype", "same_dtype", "rank", "last_dim", "batch", "k_small", "k_big"),
    "grouping_operation": ("float_dtype", "index_dtype", "rank", "batch", "index_range", "empty_features"),
    "three_nn": ("float_dtype", "same_dtype", "rank", "last_dim", "batch", "source_small"),
    "three_interpolate": ("float_dtype", "index_dtype", "same_dtype", "rank", "last_dim", "batch", "index_range",
                          "weight_shape", "empty_features"),
}
# Shape-independent checks: what the fake kernel (meta tensors) cannot see.
VALUE_RULES = {"index_range"}


@st.composite
def _draw(draw, kind):
    """A case of one op: (op, inputs [(name, data, dtype)], attrs, rules, value_rules, expected
    outputs [(ref, dtype name, allowed)] or None, grads {name: dy} or None, desc)."""
    seed = draw(S.seeds())
    rng = np.random.default_rng(seed)
    op = draw(st.sampled_from(sorted(OPS)))
    broken = draw(S.broken_aspects(ASPECTS[op]))
    dtype = draw(st.sampled_from(FLOATS))
    itype = draw(st.sampled_from(INDEX_TYPES))
    B = draw(S.weighted((1, 0), (5, 1), (4, 2), (1, 3)))
    N = draw(S.weighted((1, 0), (2, 1), (2, 3), (4, 7), (4, 20), (2, 64), (1, 200)))
    M = draw(S.weighted((1, 0), (2, 1), (2, 3), (4, 5), (3, 16), (1, 40)))
    C = draw(S.weighted((1, 0), (4, 1), (4, 3), (2, 8)))
    S_ = draw(S.weighted((1, 0), (3, 1), (3, 4), (1, 9)))
    scale = 2.0 ** draw(st.integers(-6, 6)) if dtype != "float16" else 2.0 ** draw(st.integers(-4, 3))
    specials = draw(S.weighted((6, None), (2, "nan"), (1, "naninf")))
    rules, value_rules = [], []
    attrs = {}
    dt = {}  # dtype per input name (default: dtype for T, itype for J)

    def bad(a):
        return a in broken

    # Per-op shapes (valid unless an aspect is broken) --------------------------------------
    if op == "furthest_point_sample":
        m = draw(st.integers(0, N)) if N else 0
        if bad("num_points_big"):
            m = N + draw(st.integers(1, 3))
            rules.append("num_points_big")
        if bad("num_points_neg"):
            m = -draw(st.integers(1, 2))
            rules.append("num_points_neg")
        attrs["num_points"] = m
        shapes = {"points_xyz": (B, N, 3)}
    elif op in ("ball_query", "knn", "three_nn"):
        second = "source" if op == "three_nn" else "center_xyz"
        n_pts, n_ctr = N, M
        if op == "three_nn":  # targets (N), sources (M >= 3)
            n_ctr = max(M, 3)
            if bad("source_small"):
                n_ctr = draw(st.integers(0, 2))
                rules.append("source_small")
            shapes = {"target": (B, n_pts, 3), "source": (B, n_ctr, 3)}
        else:
            shapes = {"xyz": (B, n_pts, 3), "center_xyz": (B, n_ctr, 3)}
        if op == "ball_query":
            hi = float(np.float32(scale * draw(st.sampled_from([0.25, 0.5, 1.0, 1.5, 3.0, 10.0]))))
            lo = float(np.float32(hi * draw(st.sampled_from([0.0, 0.0, 0.25, 0.5, 0.9]))))
            s = draw(S.weighted((2, 1), (3, 3), (3, 8), (1, 40)))
            if bad("max_radius"):
                hi = draw(st.sampled_from([0.0, -1.0, -0.5, float("nan")]))
                rules.append("max_radius")
            if bad("min_radius"):
                lo = draw(st.sampled_from([-0.25, hi, hi * 2 if hi > 0 else 1.0, float("nan")]))
                rules.append("min_radius")
            if bad("sample_num"):
                s = draw(st.sampled_from([0, -1]))
                rules.append("sample_num")
            if bad("empty_xyz"):
                shapes = {"xyz": (max(B, 1), 0, 3), "center_xyz": (max(B, 1), max(n_ctr, 1), 3)}
                rules.append("empty_xyz")
            elif n_pts == 0 and n_ctr > 0 and B > 0:
                rules.append("empty_xyz")
            attrs.update(min_radius=lo, max_radius=hi, sample_num=s)
        if op == "knn":
            k = draw(st.integers(1, max(1, n_pts)))
            if bad("k_small"):
                k = draw(st.sampled_from([0, -1]))
                rules.append("k_small")
            if bad("k_big"):
                k = n_pts + draw(st.integers(1, 3))
                rules.append("k_big")
            elif n_pts == 0 and not bad("k_small"):
                rules.append("k_big")
            attrs["k"] = k
        if bad("batch"):
            b0, rest = shapes[second][0], shapes[second][1:]
            shapes[second] = (b0 + draw(st.integers(1, 2)),) + rest
            rules.append("batch")
    else:  # gathers: features (B, C, N), indices
        n_src = N if op != "three_interpolate" else M
        idx_shape = {"gather_points": (B, M), "grouping_operation": (B, M, S_), "three_interpolate": (B, N, 3)}[op]
        f_shape = (B, C, n_src)
        gathers = idx_shape[1] > 0 if op == "three_interpolate" else int(np.prod(idx_shape)) > 0
        if bad("empty_features") or (n_src == 0 and C > 0 and gathers):
            f_shape = (B, max(C, 1), 0)
            if int(np.prod(idx_shape)) == 0:
                idx_shape = (max(B, 1),) + tuple(max(d, 1) for d in idx_shape[1:])
                f_shape = (idx_shape[0],) + f_shape[1:]
            rules.append("empty_features")
        shapes = {"features": f_shape, "indices": idx_shape}
        if op == "three_interpolate":
            shapes["weight"] = idx_shape
            if bad("last_dim"):
                shapes["indices"] = idx_shape[:2] + (draw(st.sampled_from([1, 2, 4])),)
                shapes["weight"] = shapes["indices"]
                rules.append("last_dim")
            if bad("weight_shape"):
                w = list(shapes["weight"])
                w[draw(st.integers(0, 1))] += draw(st.integers(1, 2))
                shapes["weight"] = tuple(w)
                rules.append("weight_shape")
        if bad("batch"):
            shapes["indices"] = (shapes["indices"][0] + draw(st.integers(1, 2)),) + shapes["indices"][1:]
            if op == "three_interpolate":
                shapes["weight"] = (shapes["indices"][0],) + shapes["weight"][1:]
            rules.append("batch")

    # Generic breakages: element types, ranks, the trailing 3 -------------------------------------
    tensor_names = [n for n, _ in OPS[op][1]]
    tvars = dict(OPS[op][1])
    for n in tensor_names:
        dt[n] = dtype if tvars[n] == "T" else itype
    if bad("float_dtype"):
        n = draw(st.sampled_from([n for n in tensor_names if tvars[n] == "T"]))
        bad_t = draw(st.sampled_from(["int32", "int64", "uint8", "bool"]))
        for m in tensor_names:
            if tvars[m] == "T":
                dt[m] = bad_t if (m == n or draw(S.chance(1, 2))) else dt[m]
        rules += ["float_dtype", "same_dtype"]
    if bad("same_dtype"):
        n = draw(st.sampled_from([n for n in tensor_names if tvars[n] == "T"][1:]))
        dt[n] = draw(st.sampled_from([t for t in FLOATS if t != dtype]))
        rules.append("same_dtype")
    if bad("index_dtype"):
        dt["indices"] = draw(st.sampled_from(["float32", "int16", "uint8", "bool"]))
        rules.append("index_dtype")
    if bad("rank"):
        n = draw(st.sampled_from(tensor_names))
        s = shapes[n]
        shapes[n] = draw(st.sampled_from([s[:-1], s + (1,)])) if len(s) > 1 else s + (1, 1)
        rules.append("rank")
    clouds = [n for n in tensor_names if len(shapes[n]) == 3 and shapes[n][-1] == 3]
    if bad("last_dim") and op != "three_interpolate" and clouds:  # (the rank may be broken already)
        n = draw(st.sampled_from(clouds))
        shapes[n] = shapes[n][:-1] + (draw(st.sampled_from([0, 1, 2, 4])),)
        rules.append("last_dim")

    # Data --------------------------------------------------------------------------------------
    data = {}
    for n in tensor_names:
        if tvars[n] == "J":
            n_src = shapes["features"][2] if len(shapes["features"]) == 3 else 1
            v = rng.integers(0, max(n_src, 1), size=shapes[n]).astype(np.float64)
            if bad("index_range") and v.size:
                flat = v.reshape(-1)
                k = int(rng.integers(flat.size))
                flat[k] = draw(st.sampled_from([-1, n_src, n_src + 5, -(2**31) if dt[n] == "int32" else -(2**40)]))
            if v.size and ((v < 0) | (v >= n_src)).any():  # also index 0 into no point at all
                value_rules.append("index_range")
        elif n in ("features",):
            v = _features(rng, shapes[n], dtype, specials)
        elif n == "weight":
            v = S.as_dtype(rng.uniform(-1, 1, shapes[n]), dtype).astype(np.float64)
        else:
            v = _cloud(rng, *shapes[n][:2], dtype, scale, specials) if shapes[n][-1:] == (3,) and len(shapes[n]) == 3 \
                else rng.integers(-8, 9, size=shapes[n]) / 4.0
        data[n] = v
    if op in ("ball_query", "knn") and not rules and data["xyz"].size and data["center_xyz"].size \
            and draw(S.chance(1, 3)):
        # centers on points: distance 0 (counts even inside min_radius), exact ties
        c = data["center_xyz"]
        pick = rng.integers(0, data["xyz"].shape[1], size=c.shape[1])
        c[:, :] = data["xyz"][:, pick]

    inputs = [(n, data[n], dt[n]) for n in tensor_names]
    desc = (f"{op} {', '.join(f'{n}{list(d.shape)} {t}' for n, d, t in inputs)} attrs={attrs} scale={scale:g} "
            f"specials={specials} broken={sorted(broken)} seed={seed}")

    # Expected outputs (valid cases) ------------------------------------------------------------
    expected = grads = None
    if not rules and not value_rules:
        expected = _expect(op, data, attrs, dtype)
        if kind == "torch" and op in GRADS and draw(S.chance(1, 3)):
            grads = True
    elif not rules and _on_cuda():
        # The CUDA kernels do not synchronize to check index values: a bad index reads as 0
        # (docs/point_cloud.md). Expected: the reference over the features with a zero point
        # appended and every bad index pointing at it.
        expected = _expect(op, _bad_indices_read_zero(data), attrs, dtype)
        value_rules = []
    return op, inputs, attrs, rules, value_rules, expected, grads, desc, rng, dtype


def _on_cuda():
    """Whether this run's cases go to the CUDA kernels (tests/fuzz/run.py --device cuda)."""
    return os.environ.get("OPBRIDGE_FUZZ_DEVICE", "cpu") == "cuda"


def _bad_indices_read_zero(data):
    f = data["features"]
    n = f.shape[-1]
    out = dict(data)
    out["features"] = np.concatenate([f, np.zeros(f.shape[:-1] + (1,))], axis=-1)
    idx = data["indices"]
    out["indices"] = np.where((idx < 0) | (idx >= n), n, idx)
    return out


def _expect(op, d, a, dtype):
    if op == "furthest_point_sample":
        return [(ref_fps(d["points_xyz"], a["num_points"]), "int64", 0.0)]
    if op == "ball_query":
        return [(ref_ball_query(a["min_radius"], a["max_radius"], a["sample_num"], d["xyz"], d["center_xyz"]),
                 "int64", 0.0)]
    if op == "knn":
        return [(ref_knn(a["k"], d["xyz"], d["center_xyz"]), "int64", 0.0)]
    if op == "three_nn":
        dist, idx = ref_three_nn(d["target"], d["source"])
        # sqrt of an exact squared distance: one rounding in the compute type, one to dtype
        return [(dist, dtype, 4 * EPS[dtype] * np.where(np.isfinite(dist), dist, 0)), (idx, "int64", 0.0)]
    if op in ("gather_points", "grouping_operation"):
        return [(ref_gather(d["features"], d["indices"]), dtype, 0.0)]
    out, mag = ref_three_interpolate(d["features"], d["indices"], d["weight"])
    return [(out, dtype, _sum_allowance(mag, 3, dtype))]


def _grad_refs(op, d, dy, dtype):
    """Expected gradients of the differentiable inputs for output gradient dy."""
    if op in ("gather_points", "grouping_operation"):
        g, mag = _scatter(d["features"].shape, d["indices"], dy)
        terms = int(np.prod(d["indices"].shape[1:])) if d["indices"].ndim > 1 else 1
        return [(g, dtype, _sum_allowance(mag, terms, dtype))]
    f, idx, w = d["features"], d["indices"].astype(np.int64), d["weight"]
    gf = np.zeros_like(f)
    mf = np.zeros_like(f)
    for j in range(3):
        wj = w[:, None, :, j] * dy  # (B, C, N)
        for b in range(f.shape[0]):
            for c in range(f.shape[1]):
                np.add.at(gf[b, c], idx[b, :, j], wj[b, c])
                np.add.at(mf[b, c], idx[b, :, j], np.abs(wj[b, c]))
    gw = np.zeros_like(w)
    mw = np.zeros_like(w)
    for b in range(f.shape[0]):
        for j in range(3):
            t = f[b][:, idx[b, :, j]] * dy[b]  # (C, N)
            gw[b, :, j] = t.sum(0)
            mw[b, :, j] = np.abs(t).sum(0)
    return [(gf, dtype, _sum_allowance(mf, 3 * idx.shape[1], dtype)),
            (gw, dtype, _sum_allowance(mw, f.shape[1], dtype))]


def _outputs_ok(expected, transform=lambda t: t):
    return oracle.Ok([oracle.Expected(ref, transform(t), allowed) for ref, t, allowed in expected])


# ------------------------------------------------------------------------------ ORT
@st.composite
def ort_cases(draw):
    op, inputs, attrs, rules, value_rules, expected, _, desc, _rng, dtype = draw(_draw("ort"))
    op_type, _, attr_names, outs = OPS[op]
    declared = draw(st.sampled_from(["unknown", "symbolic", "static"]))
    threads = draw(st.sampled_from([None, 1, 2]))
    node_name = draw(S.weighted((2, ""), (1, "pc_0")))
    ort_errors = []
    nodes, graph_inputs, feeds = [], [], {}
    for name, data, t in inputs:
        s = list(data.shape)
        dims = {"unknown": None, "symbolic": [f"{name}_{i}" for i in range(len(s))], "static": s}[declared]
        if S.ONNX_TYPES[t][1] is None:  # bfloat16: fed as float32, cast in the graph (exact)
            graph_inputs.append(helper.make_tensor_value_info(name + "_f", TensorProto.FLOAT, dims))
            feeds[name + "_f"] = np.asarray(data, np.float32)
            nodes.append(helper.make_node("Cast", [name + "_f"], [name], to=S.onnx_type(t)))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, S.onnx_type(t), dims))
            if np.issubdtype(S.ONNX_TYPES[t][1], np.integer) and t in INDEX_TYPES:
                with np.errstate(invalid="ignore"):  # NaN coordinates of a case that gives int32 points
                    feeds[name] = np.asarray(data).astype(S.ONNX_TYPES[t][1])  # out-of-range values kept
            else:
                feeds[name] = S.feed_array(np.asarray(data, np.float64), t)
    if any(r in TYPE_RULES for r in rules):
        ort_errors += ["type", "no_kernel", "type_mismatch"]
    out_types = {"T": next((t for n, _, t in inputs if dict(OPS[op][1])[n] == "T"), dtype), "I": "int64"}
    node_outs, graph_outs, y_types = [], [], []
    for name, tv in outs:
        t = out_types[tv] if out_types[tv] in S.ONNX_TYPES else "float32"
        if t == "bfloat16":
            node_outs.append(name + "_bf16")
            nodes.append(helper.make_node("Cast", [name + "_bf16"], [name], to=TensorProto.FLOAT))
            t = "float32"
        else:
            node_outs.append(name)
        graph_outs.append(helper.make_tensor_value_info(name, S.onnx_type(t), None))
        y_types.append(t)
    nodes.insert(len(nodes) - sum(1 for n in node_outs if n.endswith("_bf16")),
                 helper.make_node(op_type, [n for n, _, _ in inputs], node_outs, domain=DOMAIN, name=node_name,
                                  **{k: attrs[k] for k in attr_names}))
    graph = helper.make_graph(nodes, "fuzz_point_cloud", graph_inputs, graph_outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 3)],
                              ir_version=10)
    desc = f"{desc} declared={declared} threads={threads}"
    payload = {"kind": "ort", "model": model.SerializeToString(), "feeds": feeds, "threads": threads}
    if rules or ort_errors:
        return Case(OP, "ort", desc, payload, _error("ort", op, rules, inputs, ort_errors))
    if value_rules:
        return Case(OP, "ort", desc, payload, _error("ort", op, value_rules))
    ok = oracle.Ok([oracle.Expected(ref, yt, allowed) for (ref, _, allowed), yt in zip(expected, y_types)])
    return Case(OP, "ort", desc, payload, ok)


def _name(op, r, inputs):
    """The arguments a rule's message may name."""
    if r in ("float_dtype", "same_dtype", "rank", "last_dim"):
        return tuple(n for n, _, _ in inputs)
    return ("",)


# ------------------------------------------------------------------------------ torch
TORCH_ORDER = {"furthest_point_sample": ["points_xyz", "num_points"], "gather_points": ["features", "indices"],
               "ball_query": ["min_radius", "max_radius", "sample_num", "xyz", "center_xyz"],
               "knn": ["k", "xyz", "center_xyz"], "grouping_operation": ["features", "indices"],
               "three_nn": ["target", "source"], "three_interpolate": ["features", "indices", "weight"]}


@st.composite
def torch_cases(draw):
    op, inputs, attrs, rules, value_rules, expected, grads, desc, rng, dtype = draw(_draw("torch"))
    device = draw(S.weighted((8, "cpu"), (2, "meta")))
    by_name = {n: (d, t) for n, d, t in inputs}
    grad_names = GRADS.get(op, []) if grads and device == "cpu" else []
    specs = {}
    for n, (d, t) in by_name.items():
        layout = draw(S.layouts(d.shape)) if d.size else "contiguous"
        if (n in grad_names or n == "indices") and isinstance(layout, tuple) and layout[0] == "expand":
            layout = "contiguous"
        if isinstance(layout, tuple) and layout[0] == "expand":
            d = np.broadcast_to(np.take(d, [0], axis=layout[1]), d.shape).copy()
            by_name[n] = (d, t)
        with np.errstate(invalid="ignore"):  # NaN coordinates of a case that gives int32 points
            arr = d if t in FLOATS else S.feed_array(np.asarray(d), t) if t not in INDEX_TYPES else d.astype(t)
        specs[n] = S.tensor_spec(arr, t, layout, device, n in grad_names)
    if expected is not None and any(isinstance(s["layout"], tuple) and s["layout"][0] == "expand"
                                    for s in specs.values()):
        data = {n: d for n, (d, _) in by_name.items()}
        if _on_cuda() and "indices" in data:
            data = _bad_indices_read_zero(data)  # as _draw's expectation (no change where all are valid)
        expected = _expect(op, data, attrs, dtype)
    args = [specs[a] if a in specs else attrs[a] for a in TORCH_ORDER[op]]
    grad_spec = None
    y_dtype = expected[0][1] if expected else dtype
    desc = f"{desc} device={device} layouts={[s['layout'] for s in specs.values()]} grad={bool(grad_names)}"
    if rules:
        return Case(OP, "torch", desc, {"kind": "torch", "op": op, "args": args, "grad": None},
                    _error("torch", op, rules, inputs))
    if value_rules and device == "cpu":
        return Case(OP, "torch", desc, {"kind": "torch", "op": op, "args": args, "grad": None},
                    _error("torch", op, value_rules))
    first_ref = expected[0][0] if expected else None
    if device == "meta" or first_ref is None or first_ref.size == 0:
        shape = _out_shape(op, by_name, attrs)
        return Case(OP, "torch", desc, {"kind": "torch", "op": op, "args": args, "grad": None},
                    oracle.Ok([oracle.Expected(None, y_dtype, shape=shape)], why="meta or empty"))
    outs = [oracle.Expected(expected[0][0], expected[0][1], expected[0][2])]
    if grad_names:
        dy = S.as_dtype(rng.standard_normal(expected[0][0].shape), dtype).astype(np.float64)
        grad_spec = S.tensor_spec(dy, dtype)
        outs += [oracle.Expected(r, t, a) for r, t, a in _grad_refs(op, {n: d for n, (d, _) in by_name.items()}, dy,
                                                                    dtype)]
    return Case(OP, "torch", desc, {"kind": "torch", "op": op, "args": args, "grad": grad_spec}, oracle.Ok(outs))


def _out_shape(op, by_name, a):
    s = {n: d.shape for n, (d, _) in by_name.items()}
    if op == "furthest_point_sample":
        return (s["points_xyz"][0], a["num_points"])
    if op == "ball_query":
        return (s["xyz"][0], s["center_xyz"][1], a["sample_num"])
    if op == "knn":
        return (s["xyz"][0], a["k"], s["center_xyz"][1])
    if op == "three_nn":
        return s["target"]  # the first output (dist)
    if op == "three_interpolate":
        return s["features"][:2] + (s["indices"][1],)
    return s["features"][:2] + s["indices"][1:]
