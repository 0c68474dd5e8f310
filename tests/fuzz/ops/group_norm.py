"""Fuzz cases for GroupNorm: ai.opbridge::GroupNorm in ORT and torch.ops.opbridge.group_norm.

Tolerances (the documented accuracy, see ops/group_norm/group_norm.h): for a valid case
with finite results, every output element y satisfies

    |y - ref| <= TOL[dtype] * (|w| * (1 + |xhat|) + |b|) + 64 * 2^-53 * |w| * |mean| * rstd + tiny

where ref is the float64 reference, xhat = (x - mean) * rstd the reference's normalized value,
w and b the channel's weight and bias (1 and 0 when absent) and tiny the type's smallest
subnormal. The first term covers the output type's rounding and the statistics accumulated in
float; the second, the float64 mean's own rounding when the offset dwarfs the spread (both ours
and the reference's). Non-finite results must match exactly (see oracle.py).
"""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper

from helpers import reference

from .. import oracle
from .. import strategies as S
from ..harness import Case

OP = "group_norm"
OP_TYPE = "GroupNorm"  # the ONNX op type (kGroupNormOpType / opbridge.onnx.group_norm.OP_TYPE)
DOMAIN = "ai.opbridge"
TORCH_OP = "opbridge::group_norm"

# Relative tolerance per output type (see the module docstring): float64 and float32 cover the
# statistics' accumulation (float32: float lanes of <= 128 terms folded in double); float16 and
# bfloat16 are dominated by rounding the result (2^-11 and 2^-8 relative).
TOL = {"float64": 1e-12, "float32": 2e-5, "float16": 1e-3, "bfloat16": 8e-3}
TINY = {"float64": 5e-324, "float32": 1.5e-45, "float16": 6e-8, "bfloat16": 1e-40}
# Gradients: more terms, and float16/bfloat16 gradients are rounded from float sums.
TOL_BACKWARD = {"float64": 1e-10, "float32": 1e-4, "float16": 4e-3, "bfloat16": 3e-2}

# Numel budget of a fuzzed x: big enough for several lanes/blocks of the kernel's reductions and
# for ORT's thread pool to split work, small enough for thousands of cases a minute.
MAX_NUMEL = 4096


def _label_re(kind: str) -> str:
    if kind == "ort":
        # node_label(): "ai.opbridge::GroupNorm" plus " (node 'name')" for a named node.
        return r"ai\.opbridge::GroupNorm( \(node '[^']*'\))?: "
    return r"opbridge::group_norm: "


# The op's own validation messages (group_norm_check and the adapters), by rule.
def _rule_patterns(kind: str, weight_name: str) -> dict:
    w = weight_name
    return {
        "rank": r"x must have rank >= 2 \(N, C, \*\), got rank \d+",
        "groups_positive": r"num_groups must be > 0, got -?\d+",
        "groups_divide": r"num_groups must divide the number of channels C = (x\.shape\[1\] = )?\d+, got num_groups = \d+",
        "weight_len": rf"{w} must have C = \d+ elements \(one per channel\), got \d+",
        "bias_len": r"bias must have C = \d+ elements \(one per channel\), got \d+",
        "eps": r"eps must be finite and >= 0, got \S+",
        "groups_missing": r"required int attribute 'num_groups' is missing",
        "groups_type": r"attribute 'num_groups' must be an int, got (a float|a string|a list of ints|a list of floats)",
        "eps_type": r"attribute 'epsilon' must be a float, got (an int|a string|a list of ints|a list of floats)",
        "x_dtype": r"x must be a float32, float64, float16 or bfloat16 tensor, got \S+",
        "weight_dtype": r"weight must (have the dtype of x \(\S+\)|be a float32, float64, float16 or bfloat16 tensor), got \S+",
        "bias_dtype": r"bias must (have the dtype of x \(\S+\)|be a float32, float64, float16 or bfloat16 tensor), got \S+",
        "weight_device": r"weight must be on x's device \(\S+\), got \S+",
        "bias_device": r"bias must be on x's device \(\S+\), got \S+",
        "weight_dim": r"weight must be 1-D \(one value per channel\), got shape \[.*\]",
        "bias_dim": r"bias must be 1-D \(one value per channel\), got shape \[.*\]",
    }


# Exception type of each torch-side rule (TORCH_CHECK_VALUE -> ValueError, TORCH_CHECK_TYPE ->
# TypeError; the fake kernel uses torch._check_value / _check_type alike).
_TORCH_TYPES = {"x_dtype": "TypeError", "weight_dtype": "TypeError", "bias_dtype": "TypeError"}


def _errors(kind: str, rules, extra_ort=()) -> oracle.Error:
    """Error expectation: any of the violated rules' messages, prefixed with the op label, or
    any of the listed ORT-side refusals."""
    pats = _rule_patterns(kind, "weight")
    label = _label_re(kind)
    patterns = [label + pats[r] for r in rules] + [oracle.ORT_CLEAR[k] for k in extra_ort]
    types = ()
    if kind == "torch":
        types = tuple(sorted({_TORCH_TYPES.get(r, "ValueError") for r in rules}))
    return oracle.Error(patterns, why=", ".join(list(rules) + list(extra_ort)), types=types)


def _check_rules(rank, channels, num_groups, weight_len, bias_len, eps):
    """The rules of group_norm_check that (rank, C, G, len(w), len(b), eps) violate."""
    bad = []
    if rank < 2:
        bad.append("rank")
    if num_groups <= 0:
        bad.append("groups_positive")
    elif rank >= 2 and channels % num_groups != 0:
        bad.append("groups_divide")
    if rank >= 2 and weight_len is not None and weight_len != channels:
        bad.append("weight_len")
    if rank >= 2 and bias_len is not None and bias_len != channels:
        bad.append("bias_len")
    if not (np.isfinite(eps) and eps >= 0):
        bad.append("eps")
    return bad


# ------------------------------------------------------------------------------ values
def _expected_output(x, num_groups, w, b, eps, dtype) -> oracle.Expected:
    """Reference output of a valid, non-empty case and its elementwise allowance."""
    ref = reference.group_norm(x, num_groups, w, b, eps)
    mean, rstd = reference.group_norm_stats(x, num_groups, eps)
    xv = np.asarray(x, np.float64)
    g = xv.reshape(xv.shape[0], num_groups, -1)
    with np.errstate(invalid="ignore", over="ignore"):
        xhat = ((g - mean) * rstd).reshape(xv.shape)
        c = xv.shape[1]
        bshape = (1, c) + (1,) * (xv.ndim - 2)
        wa = np.abs(np.ones(c) if w is None else np.asarray(w, np.float64)).reshape(bshape)
        ba = np.abs(np.zeros(c) if b is None else np.asarray(b, np.float64)).reshape(bshape)
        offset = np.broadcast_to(np.abs(mean) * rstd, g.shape).reshape(xv.shape)
        allowed = TOL[dtype] * (wa * (1 + np.abs(xhat)) + ba) + 64 * 2.0**-53 * wa * offset + TINY[dtype]
    return oracle.Expected(ref, dtype, allowed)


def _expected_grads(x, num_groups, w, dy, eps, dtype, which):
    """Expected (dx, dweight, dbias) for the tensors in `which` ("x", "weight", "bias")."""
    dx, dw, db = reference.group_norm_backward(x, num_groups, w, dy, eps)
    xv = np.asarray(x, np.float64)
    dyv = np.asarray(dy, np.float64)
    c = xv.shape[1]
    bshape = (1, c) + (1,) * (xv.ndim - 2)
    wv = np.ones(c) if w is None else np.asarray(w, np.float64)
    mean, rstd = reference.group_norm_stats(x, num_groups, eps)
    groups = lambda a: a.reshape(a.shape[0], num_groups, -1)  # noqa: E731
    xhat = (groups(xv) - mean) * rstd
    wdy = np.abs(groups(dyv * wv.reshape(bshape)))
    # The terms of dx = rstd * (w dy - mean(w dy) - xhat * mean(w dy xhat)), in magnitude.
    scale_dx = rstd * (wdy + wdy.mean(axis=2, keepdims=True) + np.abs(xhat) * (wdy * np.abs(xhat)).mean(axis=2, keepdims=True))
    red = (0,) + tuple(range(2, xv.ndim))
    scale_dw = np.abs(dyv * xhat.reshape(xv.shape)).sum(axis=red)
    scale_db = np.abs(dyv).sum(axis=red)
    t = TOL_BACKWARD[dtype]
    out = {
        "x": oracle.Expected(dx, dtype, t * scale_dx.reshape(xv.shape) + TINY[dtype]),
        "weight": oracle.Expected(dw, dtype, t * scale_dw + TINY[dtype]),
        "bias": oracle.Expected(db, dtype, t * scale_db + TINY[dtype]),
    }
    return [out[k] for k in which]


@st.composite
def _shape(draw, rank, channels):
    """A shape of `rank` with shape[1] == channels (rank >= 2) and at most MAX_NUMEL elements."""
    dims = []
    for i in range(rank):
        if i == 1:
            dims.append(channels)
        else:
            size = draw(S.weighted((6, "small"), (3, "mid"), (1, "zero")))
            dims.append({"small": lambda: draw(st.sampled_from(range(1, 7))),
                         "mid": lambda: draw(st.sampled_from(range(1, 41))), "zero": lambda: 0}[size]())
    # Halve the largest non-channel dim until the numel budget holds.
    while int(np.prod(dims, dtype=np.int64)) > MAX_NUMEL:
        k = max((j for j in range(rank) if j != 1), key=lambda j: dims[j])
        if dims[k] <= 1:
            dims[1] = max(1, dims[1] // 2)
        else:
            dims[k] = max(1, dims[k] // 2)
    return tuple(dims)


def _channels():
    return st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 32, 0])


def _num_groups(channels, valid: bool):
    """A group count that is valid for `channels` or, with valid=False, one that is not."""
    if valid:
        if channels == 0:  # 0 % G == 0: any positive G (torch agrees)
            return st.sampled_from([1, 2, 3, 7, 2**62])
        if channels > 64:  # the huge dims of an empty x: no divisor search
            return st.sampled_from([1, channels])
        return st.sampled_from([g for g in range(1, channels + 1) if channels % g == 0])
    bad = [0, -1, -7, -(2**63)]
    if channels > 0:
        # channels + 1 only where it is still an int64 (C may be INT64_MAX: an empty x's huge dim).
        bad += [g for g in (channels + 1, 5, 7, 2**31, 2**62, S.INT64_MAX) if channels % g != 0 and g <= S.INT64_MAX]
    return st.sampled_from(bad)


def _x_values(draw, rng, shape, dtype, num_groups):
    """x as float64 values exactly representable in dtype, and a note on what is special.
    num_groups: a valid group count for shape (for constant groups), or None."""
    scale, offset = draw(S.float_values(dtype))
    special = draw(S.weighted((6, "none"), (1, "constant_groups"), (1, "nonfinite"), (1, "limits"), (1, "tiny_groups")))
    x = np.asarray(offset + scale * rng.standard_normal(shape))
    note = f"x~{offset:.3g}+{scale:.3g}N"
    n = int(np.prod(shape))
    if special == "constant_groups" and n > 0 and num_groups:
        g = x.reshape(shape[0], num_groups, -1)
        pick = rng.random(g.shape[:2]) < 0.6
        g[pick] = g[pick][:, :1]  # every element of a picked group = its first element
        x = g.reshape(shape)
        note += ", constant groups"
    elif special == "nonfinite":
        x = S.inject_specials(rng, x, int(rng.integers(1, 4)))
        note += ", NaN/inf"
    elif special == "limits":
        if dtype == "float16":
            # Near the float16 range limits: values up to +-65504 and subnormals.
            x = np.asarray(rng.choice([65504.0, -65504.0, 6.1e-5, -6e-8, 60000.0, 1.0], size=shape)
                           * rng.uniform(0.5, 1, shape))
            note = "x near float16 limits"
        else:
            lo, hi = S.DATA_SCALE[dtype]
            x = np.asarray(rng.choice([hi, -hi, lo, 1.0], size=shape) * rng.uniform(0.5, 1, shape))
            note = f"x near +-{hi:.0e}/{lo:.0e}"
    elif special == "tiny_groups":
        x = np.asarray(offset + scale * 1e-3 * rng.standard_normal(shape))
        note += ", variance ~1e-6 of scale"
    if special != "nonfinite":
        fmax = oracle.finfo_max(dtype)
        x = np.clip(x, -fmax, fmax)
    return S.as_dtype(x, dtype).astype(np.float64), note


def _param_values(draw, rng, c, dtype):
    mag = {"float16": 100.0}.get(dtype, 1e3)
    c = min(c, MAX_NUMEL)  # a mismatched parameter of an enormous (empty) x
    kind = draw(S.weighted((4, "unit"), (2, "wide"), (1, "zeros"), (1, "nonfinite")))
    if kind == "unit":
        v = rng.uniform(0.5, 2.0, c) * rng.choice([-1, 1], c)
    elif kind == "wide":
        v = 10 ** rng.uniform(-3, np.log10(mag), c) * rng.choice([-1, 1], c)
    elif kind == "zeros":
        v = np.zeros(c)
    else:
        v = S.inject_specials(rng, rng.standard_normal(c), 1)
    return S.as_dtype(v, dtype).astype(np.float64), kind


# ------------------------------------------------------------------------------ ORT
def _eps_attr(broken):
    """(value stored in the model or None for absent, attribute kind)."""
    if "eps_attr" in broken:
        return st.sampled_from([(0, "int"), (1, "int"), ("1e-5", "string"), (1e-5, "floats")])
    if "eps_value" in broken:
        return st.sampled_from([-1e-5, -1.0, float("nan"), float("inf"), float("-inf")]).map(lambda v: (v, "float"))
    return st.one_of(
        st.sampled_from([None, 1e-5, 0.0, -0.0, 1e-30, 1e-12, 1e-3, 0.1, 1.0, 1e30]).map(lambda v: (v, "float")),
        st.floats(1e-7, 1e-1).map(lambda v: (v, "float")),
    )


def _attr(name, value, kind):
    if kind == "float":
        return helper.make_attribute(name, float(value), attr_type=onnx.AttributeProto.FLOAT)
    if kind == "int":
        return helper.make_attribute(name, int(value), attr_type=onnx.AttributeProto.INT)
    if kind == "string":
        return helper.make_attribute(name, str(value), attr_type=onnx.AttributeProto.STRING)
    if kind == "floats":
        return helper.make_attribute(name, [float(value)], attr_type=onnx.AttributeProto.FLOATS)
    if kind == "ints":
        return helper.make_attribute(name, [int(value)], attr_type=onnx.AttributeProto.INTS)
    raise ValueError(kind)


# What a case may get wrong (strategies.broken_aspects picks none, one or two of them).
ORT_ASPECTS = ("x_type", "param_type", "structure", "feeds", "groups_attr", "eps_attr", "groups_value", "eps_value",
               "scale", "bias", "rank")


@st.composite
def ort_cases(draw):
    seed = draw(S.seeds())
    rng = np.random.default_rng(seed)
    broken = draw(S.broken_aspects(ORT_ASPECTS))
    if "x_type" in broken:
        x_type = draw(st.sampled_from(sorted(set(S.ONNX_TYPES) - set(S.FLOAT_TYPES))))
    else:
        x_type = draw(st.sampled_from(S.FLOAT_TYPES))
    valid_type = x_type in S.FLOAT_TYPES
    dtype = x_type if valid_type else "float32"  # type of the values we generate
    rank = draw(st.sampled_from([0, 1]) if "rank" in broken else S.weighted((2, 2), (2, 3), (2, 4), (1, 5), (1, 6)))
    channels = draw(_channels())
    huge = rank >= 3 and draw(S.chance(1, 15))
    if huge:
        # An empty x with enormous other dims: nothing may be allocated or looped over; ORT
        # itself refuses shapes whose running element count overflows int64.
        dims = [draw(st.sampled_from([1, 3, 2**31, 2**40, 2**61, 2**62, S.INT64_MAX])) for _ in range(rank)]
        dims[draw(st.sampled_from(range(rank)))] = 0
        shape = tuple(dims)
        channels = shape[1]
    elif rank >= 2:
        shape = draw(_shape(rank, channels))
    else:
        shape = tuple(draw(st.sampled_from(range(6))) for _ in range(rank))
    c_eff = shape[1] if rank >= 2 else 0
    num_groups = draw(_num_groups(c_eff, valid="groups_value" not in broken))
    groups_attr = draw(st.sampled_from(["missing", "float", "string", "ints"]) if "groups_attr" in broken
                       else st.just("int"))
    eps_value, eps_kind = draw(_eps_attr(broken))
    good_param = S.weighted((3, "ok"), (3, "absent"), (1, "2d"))
    bad_param = st.sampled_from(["len+1", "len-1", "empty"] if c_eff > 0 else ["len+1"])
    scale_mode = draw(bad_param if "scale" in broken else good_param)
    bias_mode = draw(bad_param if "bias" in broken else good_param)
    if "param_type" in broken:
        param_type = draw(st.sampled_from(sorted({"float32", "float64", "float16", "int32"} - {x_type})))
        if scale_mode == "absent" and bias_mode == "absent":
            scale_mode = "ok"
    else:
        param_type = x_type
    structure = draw(st.sampled_from(["extra_input", "missing_x"]) if "structure" in broken else st.just("normal"))
    feed_mode = draw(st.sampled_from(["missing_feed", "extra_feed", "wrong_feed_dtype", "absurd_declared"])
                     if "feeds" in broken else st.just("exact"))
    declared = draw(st.sampled_from(["unknown", "symbolic", "static"]))
    threads = draw(st.sampled_from([None, 1, 2]))
    node_name = draw(S.weighted((2, ""), (1, "gn_7")))
    constant_x = not huge and draw(S.chance(1, 20))  # X from ConstantOfShape: all groups constant
    if (huge or constant_x) and feed_mode == "absurd_declared":
        # X comes from ConstantOfShape; an absurd declared shape input ([2^62] elements) makes ORT
        # itself allocate for ~1 minute before failing (bad_alloc): not our op's case.
        feed_mode = "missing_feed"

    # -- values
    n_elems = 0 if huge else int(np.prod(shape, dtype=np.int64))
    if huge or constant_x:
        xv = None
        note = "x empty, huge dims" if huge else "x = ConstantOfShape"
        const_value = float(S.as_dtype(np.array([rng.standard_normal() * 10]), dtype)[0])
    else:
        ng = num_groups if (rank >= 2 and num_groups > 0 and c_eff % num_groups == 0) else None
        xv, note = _x_values(draw, rng, shape, dtype, ng)
    params = {}
    for name, mode in (("scale", scale_mode), ("bias", bias_mode)):
        if mode == "absent":
            continue
        length = {"ok": c_eff, "2d": c_eff, "len+1": c_eff + 1, "len-1": max(c_eff - 1, 0), "empty": 0}[mode]
        length = min(length, 4096)
        vals, kind = _param_values(draw, rng, length, dtype)
        params[name] = (vals.reshape((1, length)) if mode == "2d" else vals, kind)

    # -- model
    nodes, feeds, graph_inputs = [], {}, []

    def add_input(name, values, type_name, shape_):
        """Graph input `name` of ONNX type `type_name`; via Cast from float32 where numpy lacks
        the type. Returns the tensor name the GroupNorm node reads."""
        np_type = S.ONNX_TYPES[type_name][1]
        if feed_mode == "absurd_declared":
            # Declared dims no tensor can have: shape inference must cope (no overflow), the
            # feed is refused by ORT.
            dshape = [2**62, 2**62] if len(shape_) != 2 else [2**62, 2**62, 3]
        elif declared == "unknown":
            dshape = None
        elif declared == "symbolic":
            dshape = [f"{name}_d{i}" for i in range(len(shape_))]
        else:
            dshape = list(shape_)
        if np_type is None:
            graph_inputs.append(helper.make_tensor_value_info(name + "_f", TensorProto.FLOAT, dshape))
            feeds[name + "_f"] = values.astype(np.float32)
            nodes.append(helper.make_node("Cast", [name + "_f"], [name], to=S.onnx_type(type_name)))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, S.onnx_type(type_name), dshape))
            feeds[name] = S.feed_array(values, type_name)
        return name

    if huge or constant_x:
        value = helper.make_tensor("v", S.onnx_type(x_type) if x_type in S.FLOAT_TYPES else TensorProto.FLOAT, [1],
                                   [const_value])
        graph_inputs.append(helper.make_tensor_value_info("x_shape", TensorProto.INT64, [rank]))
        feeds["x_shape"] = np.array(shape, np.int64)
        nodes.append(helper.make_node("ConstantOfShape", ["x_shape"], ["X"], value=value))
        x_name = "X"
        if not valid_type:
            nodes.append(helper.make_node("Cast", ["X"], ["Xc"], to=S.onnx_type(x_type)))
            x_name = "Xc"
    else:
        x_name = add_input("X", xv, x_type, shape)
    node_inputs = ["" if structure == "missing_x" else x_name]
    for name in ("scale", "bias"):
        if name in params:
            node_inputs.append(add_input(name, params[name][0], param_type, params[name][0].shape))
        else:
            node_inputs.append("")
    if structure == "extra_input":
        node_inputs.append(node_inputs[1] or x_name)
    while node_inputs and node_inputs[-1] == "":
        node_inputs.pop()
    if structure == "missing_x" and len(node_inputs) == 1:
        node_inputs = [""]
    attrs = []
    if groups_attr != "missing":
        attrs.append(_attr("num_groups", num_groups if groups_attr in ("int", "ints") else float(num_groups),
                           groups_attr))
    if eps_value is not None:
        attrs.append(_attr("epsilon", eps_value, eps_kind))
    node = helper.make_node(OP_TYPE, node_inputs, ["Y"], domain=DOMAIN, name=node_name)
    node.attribute.extend(attrs)
    nodes.append(node)
    y_type = x_type
    out_name = "Y"
    if huge:
        nodes.append(helper.make_node("Shape", ["Y"], ["Y_shape"]))
        out_name, y_type = "Y_shape", "int64"
    elif x_type == "bfloat16":
        nodes.append(helper.make_node("Cast", ["Y"], ["Y_f"], to=TensorProto.FLOAT))
        out_name, y_type = "Y_f", "float32"
    outputs = [helper.make_tensor_value_info(out_name, S.onnx_type(y_type), None)]
    graph = helper.make_graph(nodes, "fuzz_group_norm", graph_inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)],
                              ir_version=10)

    # -- feed variations (ORT's own validation)
    ort_errors = []
    feed_names = list(feeds)
    if feed_mode == "missing_feed" and feed_names:
        del feeds[feed_names[-1]]
        ort_errors.append("feed_missing")
    elif feed_mode == "extra_feed":
        feeds["not_an_input"] = np.zeros(1, np.float32)
        ort_errors.append("feed_name")
    elif feed_mode == "absurd_declared":
        ort_errors += ["feed_rank", "feed_dims"]
    elif feed_mode == "wrong_feed_dtype" and feed_names:
        k = feed_names[0]
        feeds[k] = feeds[k].astype(np.float64 if feeds[k].dtype != np.float64 else np.float32) \
            if feeds[k].dtype != object else feeds[k]
        if feeds[k].dtype != object:
            ort_errors.append("feed_type")

    # -- expectation
    # The attribute is a float32; absent, the op's default is 1e-5f.
    eps = float(np.float32(eps_value if eps_value is not None and eps_kind == "float" else 1e-5))
    if structure == "extra_input":
        ort_errors.append("arity")
    if structure == "missing_x":
        ort_errors += ["empty_required", "arity"]
    if not valid_type:
        ort_errors += ["type", "no_kernel", "unsupported_type", "type_mismatch"]
    if params and param_type != x_type:
        ort_errors += ["type", "type_mismatch", "no_kernel"] + ([] if param_type in S.FLOAT_TYPES else ["type"])
    if huge and S.left_to_right_overflows(shape):
        ort_errors.append("shape_overflow")
    rules = []
    if groups_attr == "missing":
        rules.append("groups_missing")
    elif groups_attr != "int":
        rules.append("groups_type")
    if eps_kind != "float":
        rules.append("eps_type")
    if not rules:
        rules = _check_rules(rank, c_eff, num_groups, len_of(params, "scale"), len_of(params, "bias"), eps)
        # A 2-D scale or bias is rejected, as in torch (one declaration, one verdict).
        rules += [f"{'weight' if n == 'scale' else 'bias'}_dim" for n, m in (("scale", scale_mode), ("bias", bias_mode))
                  if m == "2d" and rank >= 2 and params]
    desc = (f"x{list(shape)} {x_type} G={num_groups}({groups_attr}) eps={eps_value}({eps_kind}) "
            f"scale={scale_mode} bias={bias_mode} params={param_type} {structure} feeds={feed_mode} "
            f"declared={declared} threads={threads} {note} seed={seed}")
    if ort_errors or rules:
        expect = _errors("ort", rules, ort_errors)
    elif huge:
        expect = oracle.Ok([oracle.Expected(np.array(shape, np.float64), "int64", 0.0)], why="empty x")
    elif n_elems == 0:
        expect = oracle.Ok([oracle.Expected(np.zeros(shape), y_type, 0.0)], why="empty x")
    else:
        if constant_x:
            xv = np.full(shape, const_value)
        w = params.get("scale", (None,))[0]
        b = params.get("bias", (None,))[0]
        exp = _expected_output(xv, num_groups, None if w is None else w.reshape(-1),
                               None if b is None else b.reshape(-1), eps, dtype)
        exp.dtype = y_type
        expect = oracle.Ok([exp])
    payload = {"kind": "ort", "model": model.SerializeToString(), "feeds": feeds, "threads": threads}
    return Case(OP, "ort", desc, payload, expect)


def len_of(params, name):
    return None if name not in params else int(params[name][0].size)


# ------------------------------------------------------------------------------ torch
def _torch_eps(broken):
    if "eps_value" in broken:
        return st.sampled_from([-1e-5, -1.0, float("nan"), float("inf"), float("-inf")])
    return st.one_of(st.sampled_from([1e-5, 0.0, -0.0, 1e-300, 1e-12, 1e-3, 1.0, 1e30]), st.floats(1e-7, 1e-1))


TORCH_ASPECTS = ("x_dtype", "weight", "bias", "groups_value", "eps_value", "rank")


@st.composite
def torch_cases(draw):
    seed = draw(S.seeds())
    rng = np.random.default_rng(seed)
    broken = draw(S.broken_aspects(TORCH_ASPECTS))
    dtype = draw(st.sampled_from(S.TORCH_BAD_TYPES if "x_dtype" in broken else S.FLOAT_TYPES))
    valid_type = dtype in S.FLOAT_TYPES
    vdtype = dtype if valid_type else "float32"
    rank = draw(st.sampled_from([0, 1]) if "rank" in broken else S.weighted((2, 2), (2, 3), (3, 4), (1, 5), (1, 6)))
    channels = draw(_channels())
    huge = rank >= 3 and draw(S.chance(1, 20))
    if huge:
        dims = [draw(st.sampled_from([1, 3, 2**31, 2**40, 2**62])) for _ in range(rank)]
        dims[draw(st.sampled_from(range(rank)))] = 0
        shape = tuple(dims)
    elif rank >= 2:
        shape = draw(_shape(rank, channels))
    else:
        shape = tuple(draw(st.sampled_from(range(6))) for _ in range(rank))
    c_eff = shape[1] if rank >= 2 else 0
    num_groups = draw(_num_groups(c_eff, valid="groups_value" not in broken))
    eps = draw(_torch_eps(broken))
    device = draw(S.weighted((15, "cpu"), (1, "meta")))
    grad = valid_type and device == "cpu" and not huge and rank >= 2 and draw(S.chance(1, 4))
    layout = "contiguous" if huge else draw(S.layouts(shape))

    # -- values: mild data when gradients are checked (the backward tolerance assumes them).
    if huge:
        xv, note = None, "x empty, huge dims"
    elif grad:
        xv = S.as_dtype(rng.standard_normal(shape) * 2 + 0.5, vdtype).astype(np.float64)
        note = "x~N(0.5,2)"
        eps = draw(st.sampled_from([1e-5, 1e-3, 0.1]))
    else:
        ng = num_groups if (rank >= 2 and num_groups > 0 and c_eff % num_groups == 0) else None
        xv, note = _x_values(draw, rng, shape, vdtype, ng)
    # Float attributes are float32 in every call: the op computes with float32(eps).
    eps = float(np.float32(eps))
    if isinstance(layout, tuple) and layout[0] == "expand":
        # Stride 0 along that dim: the data must be constant along it.
        xv = np.broadcast_to(np.take(xv, [0], axis=layout[1]), shape).copy()

    args = [None, num_groups, None, None, eps]
    rules, param_desc = [], []
    for slot, name in ((2, "weight"), (3, "bias")):
        if name in broken:
            mode = draw(st.sampled_from(["len+1", "2d", "dtype", "device"]))
        else:
            mode = draw(S.weighted((3, "ok"), (3, "none"), (1, "strided"), (1, "expanded")))
        if mode == "none":
            param_desc.append(f"{name}=None")
            continue
        length = min(c_eff + 1 if mode == "len+1" else c_eff, MAX_NUMEL)
        vals, kind = _param_values(draw, rng, length, vdtype) if not grad else (
            S.as_dtype(rng.uniform(0.5, 2, length), vdtype).astype(np.float64), "unit")
        p_dtype = vdtype
        p_device = device
        p_layout = "contiguous"
        data = vals
        if mode == "2d":
            data = vals.reshape(1, length)
            rules.append(f"{name}_dim")
        elif mode == "dtype":
            p_dtype = "float64" if vdtype != "float64" else "float32"
            rules.append(f"{name}_dtype")
        elif mode == "device":
            p_device = "meta" if device == "cpu" else "cpu"
            rules.append(f"{name}_device")
        elif mode == "strided" and length > 0:
            p_layout = ("slice", 0, 2)
        elif mode == "expanded" and length > 1:
            data = np.full(length, vals[0])
            p_layout = ("expand", 0)
        if valid_type and p_dtype != vdtype:
            data = data.astype(np.float64)
        args[slot] = S.tensor_spec(data, p_dtype, p_layout, p_device, grad and draw(S.chance(1, 2)))
        param_desc.append(f"{name}={mode}[{length}]")
        if mode == "len+1":
            rules.append(f"{name}_len")
    if huge:
        x_spec = {"data": np.zeros(0), "empty_shape": shape, "dtype": dtype, "layout": "empty", "device": device,
                  "requires_grad": False}
    else:
        x_data = xv if valid_type else S.feed_array(xv, dtype if dtype != "complex64" else "float32")
        if dtype == "complex64":
            x_data = xv.astype(np.complex64)
        x_spec = S.tensor_spec(x_data, dtype, layout, device, grad)
    args[0] = x_spec
    if not valid_type:
        rules.append("x_dtype")
    w_len = None if args[2] is None else int(np.asarray(args[2]["data"]).size)
    b_len = None if args[3] is None else int(np.asarray(args[3]["data"]).size)
    rules += _check_rules(rank, c_eff, num_groups, w_len, b_len, eps)
    # The fake kernel (meta x) checks in its own order, with the same messages.
    grad_spec = None
    which = []
    if grad and not rules:
        which = [k for k, a in (("x", args[0]), ("weight", args[2]), ("bias", args[3])) if a and a["requires_grad"]]
        grad_spec = S.tensor_spec(S.as_dtype(rng.standard_normal(shape), vdtype).astype(np.float64), vdtype)
    desc = (f"x{list(shape)} {dtype} {layout} {device} G={num_groups} eps={eps} {' '.join(param_desc)} "
            f"grad={which} {note} seed={seed}")
    # torch itself may refuse to create a tensor with such dims (its own overflow checks of the
    # element count and the strides), before our op sees it: a clear error too.
    torch_refusal = oracle.Error([r"Storage size calculation overflowed", r"Stride calculation overflowed"],
                                 why="torch refuses the shape", types=("RuntimeError",))
    if rules:
        expect = _errors("torch", sorted(set(rules)))
        if huge:
            expect.patterns = list(expect.patterns) + list(torch_refusal.patterns)
            expect.types = tuple(expect.types) + ("RuntimeError",)
    elif device == "meta" or huge or int(np.prod(shape)) == 0:
        expect = oracle.Ok([oracle.Expected(None, dtype, shape=shape)], why="meta or empty")
        if huge:
            expect = oracle.Either(expect, torch_refusal)
    else:
        w = None if args[2] is None else np.asarray(args[2]["data"], np.float64).reshape(-1)
        b = None if args[3] is None else np.asarray(args[3]["data"], np.float64).reshape(-1)
        outs = [_expected_output(xv, num_groups, w, b, eps, dtype)]
        if grad_spec is not None and which:
            outs += _expected_grads(xv, num_groups, w, grad_spec["data"], eps, dtype, which)
        expect = oracle.Ok(outs)
    payload = {"kind": "torch", "op": OP, "args": args, "grad": grad_spec if which else None}
    return Case(OP, "torch", desc, payload, expect)
