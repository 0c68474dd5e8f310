"""MultiScaleDeformableAttention: the CPU kernels (opbridge._core, every instruction-set variant),
the ORT op ai.opbridge::MultiScaleDeformableAttention and the torch op opbridge::ms_deform_attn,
against the float64 reference written from the formula (tests/helpers/reference.py).

Tests without the `torch` marker need only numpy, onnx and onnxruntime. Export: test_ms_deform_attn_export.py;
invalid input: test_ms_deform_attn_errors.py.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import opbridge
from helpers import reference
from helpers.msda_inputs import (DTYPES, assert_within, backward_allowances, f64, forward_allowance, level_tensors,
                         make_inputs, np_dtype, random_levels)

ISAS = ("baseline", "avx2", "avx512")


def _core():
    from opbridge import _core

    return _core


def needs_isa(isa):
    if not _core().cpu_isa_supported(isa):
        pytest.skip(f"this CPU or build has no {isa} kernels")


# Shapes: (name, levels or level count, N, M, D, Lq, P). The kernel rearranges value per head
# when a head's queries gather many times as many rows as it has (Lq * L * P * 4 >= 16 S: the
# "packed" path) and reads it in place otherwise ("direct"); D is split into vectors of 16 / 8
# lanes, the samples of a query into steps of 16 / 8: the cases cover full and partial steps on
# both paths.
CASES = [
    ("packed", [(4, 3), (2, 2), (1, 1)], 2, 2, 8, 40, 2),
    ("packed-wide-D", [(3, 3), (2, 1)], 1, 1, 37, 30, 5),
    ("packed-many-samples", [(4, 4), (3, 2), (2, 2), (1, 1)], 1, 2, 16, 12, 20),
    ("packed-D1", [(3, 4), (2, 2), (1, 1)], 2, 3, 1, 25, 3),
    ("direct-random-levels", 3, 2, 2, 8, 1, 2),
    ("direct-queries", [(9, 7), (4, 5), (1, 1)], 2, 2, 8, 6, 2),
    ("direct", [(9, 13), (5, 7), (1, 1)], 2, 2, 8, 1, 3),
    ("direct-wide-D", [(20, 20), (3, 1)], 1, 2, 70, 2, 2),
    ("direct-many-samples", [(16, 16), (8, 8), (4, 4), (2, 2)], 1, 1, 4, 1, 20),
    ("single-level", [(6, 4)], 3, 2, 5, 10, 4),
]
CASE_IDS = [c[0] for c in CASES]


def takes_packed_path(levels, Lq, P):
    """Mirrors use_packed() in ops/ms_deform_attn/ms_deform_attn_simd.h (keeps the cases honest)."""
    S = sum(h * w for h, w in levels)
    return Lq * len(levels) * P * 4 >= 16 * S


def case_inputs(rng, case, dtype):
    name, levels, N, M, D, Lq, P = case
    if isinstance(levels, int):
        levels = random_levels(rng, levels)
    assert takes_packed_path(levels, Lq, P) == name.startswith("packed"), f"case {name} takes the other path"
    return make_inputs(rng, levels, N, M, D, Lq, P, dtype)


def reference_of(args):
    return reference.ms_deform_attn(f64(args[0]), args[1], args[2], f64(args[3]), f64(args[4]))


def check_forward(got, args, dtype, what="output"):
    assert_within(got, reference_of(args), forward_allowance(args, dtype), what)


def check_backward(grads, go, args, dtype):
    ref = reference.ms_deform_attn_backward(f64(go), f64(args[0]), args[1], args[2], f64(args[3]), f64(args[4]))
    allowed = backward_allowances(go, args, dtype)
    for name, g, r, a in zip(("grad_value", "grad_sampling_locations", "grad_attention_weights"), grads, ref, allowed):
        assert_within(g, r, a, name)


# ---- the kernels through opbridge._core (no torch, no ORT) -------------------------------------


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_core_forward(rng, isa, dtype, case):
    needs_isa(isa)
    args = case_inputs(rng, case, dtype)
    out = _core().ms_deform_attn(*args, isa=isa)
    assert out.dtype == np_dtype(dtype)
    check_forward(out, args, dtype)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_core_backward(rng, isa, dtype, case):
    needs_isa(isa)
    args = case_inputs(rng, case, dtype)
    N, Lq = args[3].shape[:2]
    go = rng.standard_normal((N, Lq, args[0].shape[2] * args[0].shape[3])).astype(np_dtype(dtype))
    grads = _core().ms_deform_attn_backward(go, *args, isa=isa)
    for g, a in zip(grads, (args[0], args[3], args[4])):
        assert g.shape == a.shape and g.dtype == a.dtype
    check_backward(grads, go, args, dtype)


def test_core_matches_grid_sample_reference_values(rng):
    """Known values: a 2 x 3 map sampled at pixel centres, between them and past the border."""
    v = np.arange(6, dtype=np.float64).reshape(1, 6, 1, 1)  # rows y * 3 + x -> value y * 3 + x
    shapes, starts = level_tensors([(2, 3)])
    # pixel (x, y) = (loc_x * 3 - 0.5, loc_y * 2 - 0.5)
    pix = np.array([(0, 0), (2, 1), (0.5, 0), (1, 0.5), (-0.5, 0), (2.5, 1), (-1, 0), (0, 1.75)])
    loc = ((pix + 0.5) / [3, 2]).reshape(1, len(pix), 1, 1, 1, 2)
    aw = np.ones((1, len(pix), 1, 1, 1))
    expect = [0, 5, 0.5, 2.5, 0, 2.5, 0, 3 * 0.25]  # off-map taps read 0
    np.testing.assert_allclose(_core().ms_deform_attn(v, shapes, starts, loc, aw).ravel(), expect, atol=1e-15)


SPECIAL = [np.nan, np.inf, -np.inf, 1e30, -1e30, 3.4e38, -0.0, 0.0, 1.0, 1.5, -0.5, 2.0 ** -30]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("Lq", [1, 64], ids=["direct", "packed"])
def test_core_special_locations(rng, isa, dtype, Lq):
    """NaN / inf / huge / border locations: such a sample contributes exactly 0 (even with a NaN
    weight) when it has no tap on the map, and never reads outside value."""
    needs_isa(isa)
    args = list(make_inputs(rng, [(7, 5), (2, 3), (1, 1)], 2, 2, 6, Lq, 3, dtype))
    loc = args[3]
    mask = rng.random(loc.shape) < 0.5
    loc[mask] = rng.choice(SPECIAL, size=int(mask.sum())).astype(loc.dtype)
    aw = args[4]
    # NaN weights on samples that are off their map by construction (x = +inf).
    off_map = np.isinf(loc[..., 0]) & (rng.random(aw.shape) < 0.5)
    aw[off_map] = np.nan
    out = _core().ms_deform_attn(*args, isa=isa)
    check_forward(out, args, dtype)
    assert np.isfinite(out).all()  # every NaN weight sits on an off-map sample
    go = rng.standard_normal(out.shape).astype(out.dtype)
    check_backward(_core().ms_deform_attn_backward(go, *args, isa=isa), go, args, dtype)


def test_core_nan_on_the_map_propagates(rng):
    """A NaN attention weight of an on-map sample, or a NaN value row it taps, gives NaN."""
    args = list(make_inputs(rng, [(4, 4)], 1, 1, 3, 2, 1, "float64"))
    args[3][...] = 0.5  # both queries sample the map's centre: pixel (1.5, 1.5)
    args[4][0, 0] = np.nan
    args[0][0, 1 * 4 + 1, 0, 2] = np.nan  # pixel (1, 1), channel 2: a tap of both
    out = _core().ms_deform_attn(*args)
    assert np.isnan(out[0, 0]).all()
    assert np.isnan(out[0, 1, 2]) and np.isfinite(out[0, 1, :2]).all()


@pytest.mark.parametrize("dims", [dict(N=0), dict(Lq=0), dict(D=0), dict(P=0), dict(M=0)], ids=str)
def test_core_empty(rng, dims):
    sizes = dict(N=2, M=2, D=3, Lq=4, P=2)
    sizes.update(dims)
    args = make_inputs(rng, [(3, 2), (1, 1)], **sizes)
    out = _core().ms_deform_attn(*args)
    assert out.shape == (sizes["N"], sizes["Lq"], sizes["M"] * sizes["D"])
    assert not out.any()  # P = 0: nothing to sample, zeros
    go = rng.standard_normal(out.shape)
    gv, gl, ga = _core().ms_deform_attn_backward(go, *args)
    assert gv.shape == args[0].shape and gl.shape == args[3].shape and ga.shape == args[4].shape
    if sizes["Lq"] == 0 or sizes["P"] == 0:
        assert not gv.any()  # fully written, zeros


# ---- the ORT op (no torch) ----------------------------------------------------------------------

_ONNX = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE, "float16": TensorProto.FLOAT16,
         "bfloat16": TensorProto.BFLOAT16}


def ort_model(dtype, value_shape=("N", "S", 2, 8), loc_shape=("N", "Lq", 2, None, None, 2), name="msda"):
    """One MultiScaleDeformableAttention node. bfloat16 (which numpy cannot feed) comes in as
    float32 and is cast around the node."""
    t = _ONNX[dtype]
    feed_t = TensorProto.FLOAT if dtype == "bfloat16" else t
    names = ["value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"]
    inputs = [helper.make_tensor_value_info("value", feed_t, list(value_shape)),
              helper.make_tensor_value_info("spatial_shapes", TensorProto.INT64, [None, 2]),
              helper.make_tensor_value_info("level_start_index", TensorProto.INT64, [None]),
              helper.make_tensor_value_info("sampling_locations", feed_t, list(loc_shape)),
              helper.make_tensor_value_info("attention_weights", feed_t, list(loc_shape[:5]))]
    nodes, node_in = [], list(names)
    if dtype == "bfloat16":
        for i in (0, 3, 4):
            nodes.append(helper.make_node("Cast", [names[i]], [names[i] + "_bf16"], to=t))
            node_in[i] = names[i] + "_bf16"
    out = "Y_bf16" if dtype == "bfloat16" else "Y"
    nodes.append(helper.make_node("MultiScaleDeformableAttention", node_in, [out], domain=opbridge.DOMAIN, name=name))
    if dtype == "bfloat16":
        nodes.append(helper.make_node("Cast", ["Y_bf16"], ["Y"], to=TensorProto.FLOAT))
    graph = helper.make_graph(nodes, "msda", inputs, [helper.make_tensor_value_info("Y", feed_t, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(opbridge.DOMAIN, 2)],
                             ir_version=9)


def ort_session(model, threads=2):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return opbridge.InferenceSession(model.SerializeToString(), so)


def ort_feeds(args, dtype):
    names = ["value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"]
    conv = (lambda a: f64(a).astype(np.float32)) if dtype == "bfloat16" else (lambda a: a)  # exact: bf16 fits
    return {n: (conv(a) if i in (0, 3, 4) else a) for i, (n, a) in enumerate(zip(names, args))}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Lq", [1, 37], ids=["direct", "packed"])
def test_ort_matches_reference(rng, dtype, threads, Lq):
    levels = [(3, 2), (2, 2), (1, 1)] if Lq > 1 else random_levels(rng, 3)
    args = make_inputs(rng, levels, 2, 2, 8, Lq, 3, dtype)
    sess = ort_session(ort_model(dtype), threads)
    out = sess.run(None, ort_feeds(args, dtype))[0]
    if dtype == "bfloat16":
        out = out.astype(np_dtype(dtype))  # exact: the graph casts a bfloat16 result
    check_forward(out, args, dtype)


def test_ort_special_locations(rng):
    args = list(make_inputs(rng, [(7, 5), (1, 1)], 2, 2, 8, 16, 3, "float32"))
    mask = rng.random(args[3].shape) < 0.5
    args[3][mask] = rng.choice(SPECIAL, size=int(mask.sum())).astype(np.float32)
    out = ort_session(ort_model("float32")).run(None, ort_feeds(args, "float32"))[0]
    check_forward(out, args, "float32")


def test_ort_output_shape_inferred():
    """(N, Lq, M * D) with the inputs' symbols, M * D computed where both are static."""
    sess = ort_session(ort_model("float32", value_shape=("batch", "S", 4, 8), loc_shape=("batch", "queries", 4, 3, 2, 2)))
    out = sess.get_outputs()[0]
    assert out.shape == ["batch", "queries", 32] and out.type == "tensor(float)"
    # M unknown: a dimension of its own
    sess = ort_session(ort_model("float64", value_shape=("b", "S", "M", 8), loc_shape=("b", "q", "M", 3, 2, 2)))
    shape = sess.get_outputs()[0].shape
    assert shape[:2] == ["b", "q"] and isinstance(shape[2], str) and shape[2] not in ("b", "q", "M")


# ---- the torch op -------------------------------------------------------------------------------


def _torch_args(args, requires_grad=False):
    import torch

    out = []
    for i, a in enumerate(args):
        if i in (0, 3, 4):
            t = torch.from_numpy(f64(a)).to(getattr(torch, str(np.dtype(a.dtype)) if a.dtype != np_dtype("bfloat16")
                                                    else "bfloat16"))
            out.append(t.requires_grad_(requires_grad))
        else:
            out.append(torch.from_numpy(a))
    return out


@pytest.fixture
def two_threads():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.torch
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_torch_forward_and_backward(rng, two_threads, dtype, case):
    import torch

    import opbridge.ops

    args = case_inputs(rng, case, dtype)
    t = _torch_args(args, requires_grad=True)
    out = opbridge.ops.ms_deform_attn(*t)
    assert out.dtype == t[0].dtype and out.is_contiguous()
    check_forward(out.detach().float().numpy() if dtype == "bfloat16" else out.detach().numpy(), args, dtype)
    go = torch.randn(out.shape, dtype=torch.float64).to(out.dtype)
    grads = torch.autograd.grad(out, (t[0], t[3], t[4]), go)
    as_np = [g.float().numpy() if dtype == "bfloat16" else g.numpy() for g in grads]
    check_backward(as_np, go.double().numpy(), args, dtype)


@pytest.mark.torch
def test_torch_non_contiguous_inputs(rng):
    import torch

    import opbridge.ops

    args = make_inputs(rng, [(5, 6), (2, 3)], 2, 3, 4, 9, 2, "float64")
    t = _torch_args(args)
    # Same values, other layouts: a transposed copy viewed back, and a slice with a step.
    value = t[0].transpose(0, 2).contiguous().transpose(0, 2)
    loc = torch.stack([t[3], t[3]], dim=-1).flatten(-2)[..., ::2]
    assert not value.is_contiguous() and not loc.is_contiguous()
    out = opbridge.ops.ms_deform_attn(value, t[1], t[2], loc, t[4].expand(t[4].shape))
    check_forward(out.numpy(), args, "float64")


@pytest.mark.torch
@pytest.mark.parametrize("Lq", [2, 200], ids=["direct", "packed"])
def test_torch_result_independent_of_thread_count(rng, Lq):
    """Forward and backward give the same bits with 1 and 2 threads (no atomics, fixed order)."""
    import torch

    import opbridge.ops

    args = make_inputs(rng, [(16, 12), (8, 6), (1, 1)], 2, 4, 8, Lq, 4, "float32")
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            t = _torch_args(args, requires_grad=True)
            out = opbridge.ops.ms_deform_attn(*t)
            go = torch.from_numpy(np.cos(np.arange(out.numel())).reshape(out.shape).astype(np.float32))
            results.append([out.detach()] + list(torch.autograd.grad(out, (t[0], t[3], t[4]), go)))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.torch
@pytest.mark.parametrize("Lq", [1, 12], ids=["direct", "packed"])
def test_torch_gradcheck(rng, Lq):
    import torch

    import opbridge.ops

    # Locations away from pixel borders, where the bilinear form is smooth (gradcheck's finite
    # differences must not straddle a kink); some outside the maps.
    args = list(make_inputs(rng, [(3, 4), (2, 1), (1, 1)], 2, 2, 3, Lq, 2, "float64"))
    shapes = args[1]
    for l, (h, w) in enumerate(shapes):
        px = rng.integers(-1, w + 1, args[3][..., l, :, 0].shape) + rng.uniform(0.2, 0.8, args[3][..., l, :, 0].shape)
        py = rng.integers(-1, h + 1, px.shape) + rng.uniform(0.2, 0.8, px.shape)
        args[3][..., l, :, 0] = (px + 0.5) / w
        args[3][..., l, :, 1] = (py + 0.5) / h
    t = _torch_args(args, requires_grad=True)

    def f(value, loc, aw):
        return opbridge.ops.ms_deform_attn(value, t[1], t[2], loc, aw)

    assert torch.autograd.gradcheck(f, (t[0], t[3], t[4]))


@pytest.mark.torch
def test_torch_second_order_gradients_raise(rng):
    import torch

    import opbridge.ops

    t = _torch_args(make_inputs(rng, [(3, 3)], 1, 1, 2, 4, 2, "float64"), requires_grad=True)
    out = opbridge.ops.ms_deform_attn(*t)
    (gv,) = torch.autograd.grad(out.sum(), (t[0],), create_graph=True)
    with pytest.raises(NotImplementedError, match="second-order gradients"):
        torch.autograd.grad(gv.sum(), (t[3],))


@pytest.mark.torch
@pytest.mark.parametrize("low", ["float16", "bfloat16"])
def test_torch_mixed_precision(rng, low):
    """A 16-bit value with float32 locations and weights (autocast's mix) is computed in float32
    and the result cast back to value's dtype; gradients reach all three inputs."""
    import torch

    import opbridge.ops

    args = make_inputs(rng, [(6, 5), (3, 2)], 2, 2, 8, 10, 2, "float32")
    value = torch.from_numpy(args[0]).to(getattr(torch, low)).requires_grad_()
    loc = torch.from_numpy(args[3]).requires_grad_()
    aw = torch.from_numpy(args[4]).requires_grad_()
    out = opbridge.ops.ms_deform_attn(value, torch.from_numpy(args[1]), torch.from_numpy(args[2]), loc, aw)
    assert out.dtype == value.dtype
    ref_args = (value.detach().float().numpy(), args[1], args[2], args[3], args[4])
    expect = reference_of(ref_args)
    # float32 computation, one rounding to the 16-bit type
    rtol = 2.0**-10 if low == "float16" else 2.0**-7
    terms, _ = reference.ms_deform_attn_bounds(*[f64(a) if i in (0, 3, 4) else a for i, a in enumerate(ref_args)])
    assert_within(out.detach().float().numpy(), expect, rtol * terms + 1e-6)
    grads = torch.autograd.grad(out.float().sum(), (value, loc, aw))
    assert [g.dtype for g in grads] == [value.dtype, torch.float32, torch.float32]


@pytest.mark.torch
def test_torch_opcheck(rng):
    import torch

    import opbridge.ops  # noqa: F401

    for dtype, Lq in (("float32", 3), ("float64", 20), ("float16", 5)):
        args = make_inputs(rng, [(4, 3), (2, 2)], 2, 2, 4, Lq, 2, dtype)
        t = _torch_args(args, requires_grad=dtype != "float16")
        torch.library.opcheck(torch.ops.opbridge.ms_deform_attn.default, tuple(t))
        go = torch.randn(2, Lq, 8, dtype=t[0].dtype)
        torch.library.opcheck(torch.ops.opbridge.ms_deform_attn_backward.default,
                              (go, *[x.detach() for x in t]))


@pytest.mark.torch
def test_torch_export_dynamic_batch_and_queries(rng):
    """torch.export keeps N and Lq symbolic (the fake kernel specializes nothing), and the
    exported program runs other sizes."""
    import torch
    from torch.export import Dim

    import opbridge.ops

    class Attn(torch.nn.Module):
        def forward(self, value, spatial_shapes, level_start_index, loc, aw):
            return opbridge.ops.ms_deform_attn(value, spatial_shapes, level_start_index, loc, aw) * 2

    args = _torch_args(make_inputs(rng, [(5, 4), (2, 3)], 2, 2, 4, 6, 2, "float32"))
    b, q = Dim("batch"), Dim("queries")
    ep = torch.export.export(Attn(), tuple(args), dynamic_shapes=({0: b}, None, None, {0: b, 1: q}, {0: b, 1: q}))
    out_node = [n for n in ep.graph.nodes if n.op == "output"][0].args[0][0]
    n_sym, q_sym, md = out_node.meta["val"].shape
    assert isinstance(n_sym, torch.SymInt) and isinstance(q_sym, torch.SymInt) and md == 8
    other = make_inputs(rng, [(5, 4), (2, 3)], 3, 2, 4, 11, 2, "float32")
    got = ep.module()(*_torch_args(other))
    check_forward(got.numpy() / 2, other, "float32")


@pytest.mark.torch
def test_torch_compile(rng):
    import shutil

    import torch

    import opbridge.ops

    if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        pytest.skip("inductor compiles the graph's C++ and there is no compiler on PATH")

    args = make_inputs(rng, [(5, 4), (2, 3)], 2, 2, 4, 6, 2, "float32")
    f = torch.compile(lambda *a: opbridge.ops.ms_deform_attn(*a) + 1, fullgraph=True, dynamic=True)
    check_forward(f(*_torch_args(args)).numpy() - 1, args, "float32")
