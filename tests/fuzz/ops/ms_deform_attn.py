"""Fuzz cases for MultiScaleDeformableAttention: ai.opbridge::MultiScaleDeformableAttention in ORT
and torch.ops.opbridge.ms_deform_attn (with gradients).

Tolerances (the documented accuracy, docs/ms_deform_attn.md; tests/helpers/msda_inputs.py): for a valid
case, every output element r satisfies

    |r - ref| <= TOL_SUM[dtype] * terms + TOL_COORD[dtype] * coords + tiny

with ref the float64 reference on the same values (tests/helpers/reference.py, written from the
formula), terms the sum of the magnitudes of r's terms and coords its sensitivity to rounding
the pixel coordinates (computed in float for all but float64). Gradients alike (TOL_GRAD); a
location-gradient component whose pixel coordinate lies within rounding of an integer is not
checked (the derivative jumps there). Non-finite results must match exactly: a sample with no
tap on its map, or at a NaN/inf location, contributes exactly 0 whatever its weight, and NaN or
inf in an on-map sample's weight or tapped values propagates.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from onnx import TensorProto, helper

from helpers import reference
from helpers.msda_inputs import (TOL_COORD, TOL_SUM, TINY, backward_allowances, level_tensors)

from .. import oracle
from .. import strategies as S
from ..harness import Case

OP = "ms_deform_attn"
OP_TYPE = "MultiScaleDeformableAttention"  # kMsDeformAttnOpType / opbridge.onnx.ms_deform_attn.OP_TYPE
DOMAIN = "ai.opbridge"
NAMES = ["value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"]
MAX_LEVELS = 16
# Element budget of a case's largest tensor (value or locations): thousands of cases a minute.
MAX_NUMEL = 6000

RULES = {
    "value_dtype": r"value must be a float32, float64, float16 or bfloat16 tensor, got \S+",
    "loc_dtype": r"sampling_locations must have the dtype of value \(\S+\), got \S+",
    "aw_dtype": r"attention_weights must have the dtype of value \(\S+\), got \S+",
    "shapes_dtype": r"spatial_shapes must be an int64 tensor, got \S+",
    "starts_dtype": r"level_start_index must be an int64 tensor, got \S+",
    "value_rank": r"value must have rank 4 \(N, S, M, D\), got shape \[.*\]",
    "shapes_rank": r"spatial_shapes must have shape \(L, 2\), one \(H, W\) row per level, got shape \[.*\]",
    "starts_rank": r"level_start_index must have shape \(L,\), one start per level, got shape \[.*\]",
    "loc_rank": r"sampling_locations must have shape \(N, Lq, M, L, P, 2\), got shape \[.*\]",
    "aw_rank": r"attention_weights must have shape \(N, Lq, M, L, P\), got shape \[.*\]",
    "level_count": r"spatial_shapes must have between 1 and 16 rows \(one per level\), got \d+",
    "starts_len": r"level_start_index must have L = \d+ elements \(one per row of spatial_shapes\), got shape \[.*\]",
    "loc_dims": r"sampling_locations must have shape \(N, Lq, M, L, P, 2\) with N = value.shape\[0\] = \d+, M = "
                r"value.shape\[2\] = \d+ and L = spatial_shapes.shape\[0\] = \d+, got shape \[.*\]",
    "aw_dims": r"attention_weights must have shape \(N, Lq, M, L, P\) = sampling_locations.shape\[:5\] = \[.*\], got "
               r"shape \[.*\]",
    "hw": r"spatial_shapes\[\d+\] = \(-?\d+, -?\d+\): H and W must be > 0",
    "start": r"level_start_index\[\d+\] must be \d+ \(the sum of H \* W of the levels before it\), got -?\d+",
    "sum": r"the levels' sizes must add up to S = value.shape\[1\] = \d+, got sum of H \* W over spatial_shapes = "
           r"(\d+|more than 2\^63)",
    "device": r"\w+ must be on value's device \(\S+\), got \S+",
}
LABEL = {"ort": r"ai\.opbridge::MultiScaleDeformableAttention( \(node '[^']*'\))?: ",
         "torch": r"opbridge::ms_deform_attn: "}
TORCH_TYPES = {"value_dtype": "TypeError", "loc_dtype": "TypeError", "aw_dtype": "TypeError",
               "shapes_dtype": "TypeError", "starts_dtype": "TypeError"}


def _error(kind, rules, ort=()):
    patterns = [LABEL[kind] + RULES[r] for r in rules] + [oracle.ORT_CLEAR[k] for k in ort]
    types = tuple(sorted({TORCH_TYPES.get(r, "ValueError") for r in rules})) if kind == "torch" else ()
    return oracle.Error(patterns, why=", ".join(list(rules) + list(ort)), types=types)


# ------------------------------------------------------------------------------ valid inputs
@st.composite
def _sizes(draw):
    """(levels, N, M, D, Lq, P) within the element budget."""
    L = draw(S.weighted((3, 1), (3, 2), (4, 3), (4, 4), (1, 5), (1, 16)))
    side = lambda: draw(S.weighted((3, 1), (4, 2), (4, 3), (3, 5), (2, 8), (1, 13)))  # noqa: E731
    levels = [(side(), side()) for _ in range(L)]
    N = draw(S.weighted((1, 0), (6, 1), (4, 2), (1, 3)))
    M = draw(S.weighted((5, 1), (4, 2), (2, 3), (2, 8)))
    D = draw(S.weighted((1, 0), (3, 1), (2, 3), (4, 8), (3, 16), (2, 17), (2, 32), (1, 33)))
    Lq = draw(S.weighted((1, 0), (4, 1), (3, 3), (4, 10), (3, 40), (2, 100)))
    P = draw(S.weighted((1, 0), (4, 1), (4, 2), (3, 4), (1, 9)))
    S_ = sum(h * w for h, w in levels)
    while max(N * S_ * M * D, N * Lq * M * L * P * 2) > MAX_NUMEL:
        if Lq > 1:
            Lq //= 2
        elif D > 1:
            D //= 2
        elif M > 1:
            M //= 2
        else:
            N = max(0, N // 2)
    return levels, N, M, D, Lq, P


LOCATION_KINDS = ("uniform", "uniform", "model", "inside", "specials", "borders")


def _locations(draw, rng, levels, shape, dtype, kind):
    """(N, Lq, M, L, P, 2) locations of `kind` as float64 values exactly representable in dtype."""
    if kind == "uniform":
        loc = rng.uniform(-0.3, 1.3, shape)
    elif kind == "inside":
        loc = rng.uniform(0.0, 1.0, shape)
    elif kind == "model":
        # reference points + small offsets in pixels of each level (a random-init Deformable DETR)
        n, lq, m, L, p, _ = shape
        ref = rng.uniform(0, 1, (n, lq, 1, 1, 1, 2))
        wh = np.array([[w, h] for h, w in levels], np.float64).reshape(1, 1, 1, L, 1, 2)
        loc = ref + rng.normal(0, 2, shape) / wh
    elif kind == "specials":
        loc = rng.uniform(-0.3, 1.3, shape)
        mask = rng.random(shape) < 0.3
        loc[mask] = rng.choice([np.nan, np.inf, -np.inf, 1e30, -1e30, 3e38, 0.0, 1.0, -1.0, 2.0], size=int(mask.sum()))
    else:  # exact pixel centres and borders: (k + {0, 0.5}) / size
        n, lq, m, L, p, _ = shape
        size = np.array([[w, h] for h, w in levels], np.float64).reshape(1, 1, 1, L, 1, 2)
        k = rng.integers(-1, 3, shape) + np.floor(rng.uniform(0, 1, shape) * size)
        loc = (k + rng.choice([0.0, 0.5], shape)) / size
    return S.as_dtype(loc, dtype).astype(np.float64), kind


def _values(draw, rng, shape, dtype, specials_ok=True):
    scale = draw(S.weighted((6, 1.0), (1, 1e-3), (1, 100.0)))
    v = rng.standard_normal(shape) * scale
    note = f"~N(0,{scale:g})"
    if specials_ok and v.size and draw(S.chance(1, 8)):
        v = S.inject_specials(rng, v, int(rng.integers(1, 3)))
        note += "+NaN/inf"
    return S.as_dtype(v, dtype).astype(np.float64), note


def _expected_forward(args, dtype):
    ref = reference.ms_deform_attn(*args)
    terms, coords = reference.ms_deform_attn_bounds(*args)
    return oracle.Expected(ref, dtype, TOL_SUM[dtype] * terms + TOL_COORD[dtype] * coords + TINY[dtype])


# ------------------------------------------------------------------------------ broken inputs
def _break_shapes(draw, rng, levels, N, M, D, Lq, P, broken):
    """Shapes of the five inputs, with the `broken` aspects made invalid; returns
    (shapes per input, level data (spatial_shapes, level_start_index) or None, rules violated)."""
    L = len(levels)
    S_ = sum(h * w for h, w in levels)
    value = [N, S_, M, D]
    shp = [L, 2]
    st_ = [L]
    loc = [N, Lq, M, L, P, 2]
    aw = [N, Lq, M, L, P]
    rules = []
    spatial, starts = level_tensors(levels)
    if "ranks" in broken:
        which = draw(st.sampled_from(["value", "shapes", "starts", "loc", "aw"]))
        target = {"value": value, "shapes": shp, "starts": st_, "loc": loc, "aw": aw}[which]
        if draw(S.chance(1, 2)) and len(target) > 1:
            target.pop()
        else:
            target.append(1)
        rules.append({"value": "value_rank", "shapes": "shapes_rank", "starts": "starts_rank", "loc": "loc_rank",
                      "aw": "aw_rank"}[which])
        spatial = spatial if which != "shapes" else np.ones(shp, np.int64)
        starts = starts if which != "starts" else np.zeros(st_, np.int64)
    if "dims" in broken and not rules:
        which = draw(st.sampled_from(["starts_len", "loc_n", "loc_m", "loc_l", "aw_q", "aw_p", "loc_last"]))
        if which == "starts_len":
            st_[0] += 1
            starts = np.zeros(st_, np.int64)
            rules.append("starts_len")
        elif which == "loc_last":
            loc[5] = 3
            rules.append("loc_rank")
        elif which.startswith("loc"):
            axis = {"loc_n": 0, "loc_m": 2, "loc_l": 3}[which]
            loc[axis] += 1
            aw[axis] += 1
            rules.append("loc_dims")
        else:
            aw[{"aw_q": 1, "aw_p": 4}[which]] += 1
            rules.append("aw_dims")
    if "levels" in broken and not rules:
        which = draw(st.sampled_from(["zero", "negative", "start", "first_start", "sum", "huge", "overflow"]))
        spatial = spatial.copy()
        starts = starts.copy()
        l = int(rng.integers(L))
        if which == "zero":
            spatial[l, int(rng.integers(2))] = 0
            rules.append("hw")
        elif which == "negative":
            spatial[l] = -spatial[l]
            rules.append("hw")
        elif which == "start" and L > 1:
            starts[L - 1] += int(rng.choice([-1, 1]))
            rules.append("start")
        elif which == "first_start":
            starts[0] = 1
            rules.append("start")
        elif which == "huge":
            spatial[l] = (2**31, 2**31)
            starts = np.concatenate([[0], np.cumsum(spatial.prod(axis=1))[:-1]]).astype(np.int64)
            rules.append("sum")
        elif which == "overflow":
            spatial[l] = (2**32, 2**32)
            rules += ["sum", "start"]
        else:
            spatial[l, 0] += 1
            starts = np.concatenate([[0], np.cumsum(spatial.prod(axis=1))[:-1]]).astype(np.int64)
            rules.append("sum")
    if "level_count" in broken and not rules:
        # 0 or 17 levels: the level count is checked before any level's contents.
        count = draw(st.sampled_from([0, 17]))
        levels = [(1, 1)] * count
        spatial, starts = level_tensors(levels) if count else (np.zeros((0, 2), np.int64), np.zeros(0, np.int64))
        value[1] = count
        shp[0] = st_[0] = loc[3] = aw[3] = count
        rules.append("level_count")
    return {"value": value, "shapes": shp, "starts": st_, "loc": loc, "aw": aw}, (spatial, starts), rules


# ------------------------------------------------------------------------------ ORT
ORT_ASPECTS = ("value_type", "int_type", "type_mismatch", "structure", "feeds", "ranks", "dims", "levels",
               "level_count")
FLOATS = ("float32", "float64", "float16", "bfloat16")


@st.composite
def ort_cases(draw):
    seed = draw(S.seeds())
    rng = np.random.default_rng(seed)
    broken = draw(S.broken_aspects(ORT_ASPECTS))
    dtype = draw(st.sampled_from(FLOATS))
    levels, N, M, D, Lq, P = draw(_sizes())
    shapes, (spatial, starts), rules = _break_shapes(draw, rng, levels, N, M, D, Lq, P, broken)
    ort_errors = []
    vdt = ldt = adt = dtype  # element types of value, locations, weights in the model
    sdt = tdt = "int64"
    if "value_type" in broken:
        vdt = ldt = adt = draw(st.sampled_from(["int32", "int64", "uint8", "bool"]))
        ort_errors += ["type", "no_kernel", "type_mismatch"]
    if "int_type" in broken:
        sdt = draw(st.sampled_from(["int32", "float32", "uint64"]))
        ort_errors += ["type", "no_kernel", "type_mismatch"]
    if "type_mismatch" in broken:
        ldt = draw(st.sampled_from([t for t in FLOATS if t != dtype]))
        ort_errors += ["type", "no_kernel", "type_mismatch"]
    structure = draw(st.sampled_from(["extra_input", "missing_input"]) if "structure" in broken else st.just("normal"))
    if structure != "normal":
        ort_errors += ["arity", "empty_required"]
    feed_mode = draw(st.sampled_from(["missing_feed", "extra_feed", "wrong_feed_dtype"]) if "feeds" in broken
                     else st.just("exact"))
    declared = draw(st.sampled_from(["unknown", "symbolic", "static"]))
    threads = draw(st.sampled_from([None, 1, 2]))
    node_name = draw(S.weighted((2, ""), (1, "msda_0")))

    # NaN/inf values only where no location sits within rounding of a pixel border: there the
    # float and float64 computations may pick different taps (both right), which is harmless for
    # finite values but not for a NaN one.
    kind = draw(st.sampled_from(LOCATION_KINDS))
    value, vnote = _values(draw, rng, shapes["value"], dtype, specials_ok=kind != "borders")
    loc, lnote = _locations(draw, rng, levels, shapes["loc"], dtype, kind) if not rules else (
        rng.uniform(0, 1, shapes["loc"]), "broken")
    aw, anote = _values(draw, rng, shapes["aw"], dtype, specials_ok=kind != "borders")

    nodes, graph_inputs, feeds = [], [], {}
    node_inputs = []
    for name, data, t in (("value", value, vdt), ("spatial_shapes", spatial, sdt), ("level_start_index", starts, tdt),
                          ("sampling_locations", loc, ldt), ("attention_weights", aw, adt)):
        s = list(np.shape(data))
        dims = {"unknown": None, "symbolic": [f"{name}_{i}" for i in range(len(s))], "static": s}[declared]
        if S.ONNX_TYPES[t][1] is None:  # bfloat16: fed as float32, cast in the graph (exact)
            graph_inputs.append(helper.make_tensor_value_info(name + "_f", TensorProto.FLOAT, dims))
            with np.errstate(over="ignore", invalid="ignore"):
                feeds[name + "_f"] = np.asarray(data, np.float32)
            nodes.append(helper.make_node("Cast", [name + "_f"], [name], to=S.onnx_type(t)))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, S.onnx_type(t), dims))
            # int64 level data as is (S.feed_array clips integers, which would break valid cases)
            level_data = name in ("spatial_shapes", "level_start_index") and t == "int64"
            feeds[name] = np.asarray(data, np.int64) if level_data else S.feed_array(np.asarray(data, np.float64), t)
        node_inputs.append(name)
    if structure == "extra_input":
        node_inputs.append("value")
    elif structure == "missing_input":
        node_inputs[int(rng.integers(5))] = ""
    out_t = vdt if vdt in FLOATS else "float32"
    if out_t == "bfloat16":
        nodes.append(helper.make_node(OP_TYPE, node_inputs, ["Y_bf16"], domain=DOMAIN, name=node_name))
        nodes.append(helper.make_node("Cast", ["Y_bf16"], ["Y"], to=TensorProto.FLOAT))
        y_type = "float32"
    else:
        nodes.append(helper.make_node(OP_TYPE, node_inputs, ["Y"], domain=DOMAIN, name=node_name))
        y_type = out_t
    graph = helper.make_graph(nodes, "fuzz_msda", graph_inputs,
                              [helper.make_tensor_value_info("Y", S.onnx_type(y_type), None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 2)],
                              ir_version=10)
    names = list(feeds)
    if feed_mode == "missing_feed":
        del feeds[names[int(rng.integers(len(names)))]]
        ort_errors.append("feed_missing")
    elif feed_mode == "extra_feed":
        feeds["not_an_input"] = np.zeros(1, np.float32)
        ort_errors.append("feed_name")
    elif feed_mode == "wrong_feed_dtype":
        k = names[int(rng.integers(len(names)))]
        feeds[k] = feeds[k].astype(np.float32 if feeds[k].dtype != np.float32 else np.float64)
        ort_errors.append("feed_type")

    desc = (f"levels={levels} N={N} M={M} D={D} Lq={Lq} P={P} {dtype} value {vnote} loc {lnote} aw {anote} "
            f"types=({vdt},{sdt},{ldt}) {structure} feeds={feed_mode} declared={declared} threads={threads} "
            f"broken={sorted(broken)} seed={seed}")
    payload = {"kind": "ort", "model": model.SerializeToString(), "feeds": feeds, "threads": threads}
    if rules or ort_errors:
        return Case(OP, "ort", desc, payload, _error("ort", rules, ort_errors))
    exp = _expected_forward((value, spatial, starts, loc, aw), dtype)
    exp.dtype = y_type
    return Case(OP, "ort", desc, payload, oracle.Ok([exp]))


# ------------------------------------------------------------------------------ torch
TORCH_ASPECTS = ("value_dtype", "loc_dtype", "int_dtype", "ranks", "dims", "levels", "level_count", "device")


@st.composite
def torch_cases(draw):
    seed = draw(S.seeds())
    rng = np.random.default_rng(seed)
    broken = draw(S.broken_aspects(TORCH_ASPECTS))
    dtype = draw(st.sampled_from(FLOATS))
    levels, N, M, D, Lq, P = draw(_sizes())
    device = draw(S.weighted((12, "cpu"), (1, "meta")))
    shapes, (spatial, starts), rules = _break_shapes(draw, rng, levels, N, M, D, Lq, P, broken)
    if device == "meta":
        # The fake kernel checks what shapes and dtypes show; level contents are not read.
        rules = [r for r in rules if r not in ("hw", "start", "sum")]
    vdt = ldt = adt = dtype
    sdt = tdt = "int64"
    if "value_dtype" in broken:
        vdt = draw(st.sampled_from(["int32", "int64", "bool", "complex64"]))
        rules.insert(0, "value_dtype")
    if "loc_dtype" in broken:
        which = draw(st.sampled_from(["loc", "aw"]))
        # (the raw op is called here: it refuses every mix, also the 16-bit value with float32
        # locations and weights that the Python wrapper computes in float32)
        other = draw(st.sampled_from([t for t in FLOATS if t != dtype]))
        if which == "loc":
            ldt = other
        else:
            adt = other
        if "value_dtype" not in broken:
            rules.insert(0, "loc_dtype" if which == "loc" else "aw_dtype")
    if "int_dtype" in broken:
        which = draw(st.sampled_from(["shapes", "starts"]))
        bad = draw(st.sampled_from(["int32", "float32"]))
        if which == "shapes":
            sdt = bad
        else:
            tdt = bad
        if not any(r in rules for r in ("value_dtype", "loc_dtype", "aw_dtype")):
            rules.insert(0, "shapes_dtype" if which == "shapes" else "starts_dtype")
    meta_one = None
    if "device" in broken and device == "cpu":
        # A meta tensor among CPU ones: the fake kernel runs and refuses the mix (its dtype checks
        # come first, so those rules stay acceptable too).
        meta_one = draw(st.sampled_from(["sampling_locations", "attention_weights"]))
        rules = [r for r in rules if r not in ("hw", "start", "sum")] + ["device"]
    kind = draw(st.sampled_from(LOCATION_KINDS))
    value, vnote = _values(draw, rng, shapes["value"], dtype, specials_ok=kind != "borders")
    loc, lnote = _locations(draw, rng, levels, shapes["loc"], dtype, kind) if not rules else (
        rng.uniform(0, 1, shapes["loc"]), "broken")
    aw, anote = _values(draw, rng, shapes["aw"], dtype, specials_ok=kind != "borders")
    grad = (not rules and device == "cpu" and value.size > 0 and loc.size > 0 and draw(S.chance(1, 3)))
    if grad:
        # Gradients: finite data (NaN/inf gradients are exercised by the kernel tests).
        value = S.as_dtype(rng.standard_normal(shapes["value"]), dtype).astype(np.float64)
        aw = S.as_dtype(rng.standard_normal(shapes["aw"]), dtype).astype(np.float64)
        loc = S.as_dtype(rng.uniform(-0.2, 1.2, shapes["loc"]), dtype).astype(np.float64)
        lnote = anote = vnote = "finite (gradient)"
    specs = []
    for name, data, t in (("value", value, vdt), ("spatial_shapes", spatial, sdt), ("level_start_index", starts, tdt),
                          ("sampling_locations", loc, ldt), ("attention_weights", aw, adt)):
        float_in = name in ("value", "sampling_locations", "attention_weights")
        layout = draw(S.layouts(np.shape(data))) if float_in else "contiguous"
        if isinstance(layout, tuple) and layout[0] == "expand":
            if grad:
                layout = "contiguous"  # gradients of an expanded input sum over its copies
            else:
                data = np.broadcast_to(np.take(data, [0], axis=layout[1]), np.shape(data)).copy()
        if t in FLOATS:
            arr = np.asarray(data, np.float64)
        elif t == "complex64":
            arr = np.asarray(data).astype(np.complex64)
        else:
            arr = S.feed_array(np.asarray(data, np.float64), t) if t != "int64" else np.asarray(data, np.int64)
        dev = "meta" if name == meta_one else device
        specs.append(S.tensor_spec(arr, t, layout, dev, grad and float_in and draw(S.chance(2, 3))))
        if name == "value":
            value = data
        elif name == "sampling_locations":
            loc = data
        elif name == "attention_weights":
            aw = data
    grad_spec = None
    if grad and any(sp["requires_grad"] for sp in specs):
        grad_spec = S.tensor_spec(S.as_dtype(rng.standard_normal((N, Lq, M * D)), dtype).astype(np.float64), dtype)
    desc = (f"levels={levels} N={N} M={M} D={D} Lq={Lq} P={P} {dtype} {device} value {vnote} loc {lnote} aw {anote} "
            f"types=({vdt},{sdt},{tdt},{ldt},{adt}) meta={meta_one} grad={grad_spec is not None} "
            f"broken={sorted(broken)} seed={seed}")
    payload = {"kind": "torch", "op": OP, "args": specs, "grad": grad_spec}
    if rules:
        return Case(OP, "torch", desc, payload, _error("torch", rules))
    out_shape = (N, Lq, M * D)
    if device == "meta" or N * Lq * M * D == 0 and grad_spec is None:
        return Case(OP, "torch", desc, payload,
                    oracle.Ok([oracle.Expected(None, dtype, shape=out_shape)], why="meta or empty"))
    args = (value, spatial, starts, loc, aw)
    outs = [_expected_forward(args, dtype)] if N * Lq * M * D else [None]
    if grad_spec is not None:
        go = grad_spec["data"]
        ref = reference.ms_deform_attn_backward(go, *args)
        allowed = backward_allowances(go, args, dtype)
        for k, spec in ((0, specs[0]), (1, specs[3]), (2, specs[4])):
            if spec["requires_grad"]:
                outs.append(oracle.Expected(ref[k], dtype, allowed[k]) if ref[k].size else
                            oracle.Expected(None, dtype, shape=ref[k].shape))
    return Case(OP, "torch", desc, payload, oracle.Ok(outs))
