"""Invalid arguments of MultiScaleDeformableAttention: every path (opbridge._core, the torch op,
its fake kernel on meta tensors, the ORT op) refuses them with the same message (one C++ check,
mirrored by the fake kernel for what shapes alone show), never a crash or an out-of-bounds read."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import opbridge
from helpers.msda_inputs import level_tensors

LEVELS = [(3, 4), (2, 2)]  # S = 16
N, M, D, LQ, P = 2, 2, 3, 5, 2


def valid_args():
    rng = np.random.default_rng(0)
    shapes, starts = level_tensors(LEVELS)
    value = rng.standard_normal((N, 16, M, D)).astype(np.float32)
    loc = rng.uniform(0, 1, (N, LQ, M, len(LEVELS), P, 2)).astype(np.float32)
    aw = rng.uniform(0, 1, (N, LQ, M, len(LEVELS), P)).astype(np.float32)
    return [value, shapes, starts, loc, aw]


def _replace(i, fn):
    def mutate(args):
        args[i] = fn(args[i])
        return args

    return mutate


def _levels(shapes, starts=None):
    def mutate(args):
        args[1] = np.array(shapes, np.int64).reshape(-1, 2)
        args[2] = np.array(starts, np.int64) if starts is not None else level_tensors(shapes)[1]
        return args

    return mutate


def _many_levels(count):
    def mutate(args):
        levels = [(1, 1)] * count
        args[1], args[2] = level_tensors(levels)
        args[0] = args[0][:, :count] if count <= 16 else np.zeros((N, count, M, D), np.float32)
        args[3] = np.full((N, LQ, M, count, P, 2), 0.5, np.float32)
        args[4] = np.ones((N, LQ, M, count, P), np.float32)
        return args

    return mutate


# (id, mutation, message core, exception type in torch / _core, checked by shapes alone)
CASES = [
    ("value-dtype", _replace(0, lambda a: a.astype(np.int32)),
     r"value must be a float32, float64, float16 or bfloat16 tensor, got int32", TypeError, True),
    ("loc-dtype", _replace(3, lambda a: a.astype(np.float64)),
     r"sampling_locations must have the dtype of value \(float32\), got float64", TypeError, True),
    ("weights-dtype", _replace(4, lambda a: a.astype(np.float16)),
     r"attention_weights must have the dtype of value \(float32\), got float16", TypeError, True),
    ("shapes-dtype", _replace(1, lambda a: a.astype(np.int32)),
     r"spatial_shapes must be an int64 tensor, got int32", TypeError, True),
    ("starts-dtype", _replace(2, lambda a: a.astype(np.float32)),
     r"level_start_index must be an int64 tensor, got float32", TypeError, True),
    ("value-rank", _replace(0, lambda a: a[0]),
     r"value must have rank 4 \(N, S, M, D\), got shape \[16, 2, 3\]", ValueError, True),
    ("shapes-columns", _replace(1, lambda a: np.concatenate([a, a[:, :1]], axis=1)),
     r"spatial_shapes must have shape \(L, 2\), one \(H, W\) row per level, got shape \[2, 3\]", ValueError, True),
    ("starts-rank", _replace(2, lambda a: a.reshape(1, 2)),
     r"level_start_index must have shape \(L,\), one start per level, got shape \[1, 2\]", ValueError, True),
    ("loc-rank", _replace(3, lambda a: a[0]),
     r"sampling_locations must have shape \(N, Lq, M, L, P, 2\), got shape \[5, 2, 2, 2, 2\]", ValueError, True),
    ("loc-last-dim", _replace(3, lambda a: np.concatenate([a, a[..., :1]], axis=-1)),
     r"sampling_locations must have shape \(N, Lq, M, L, P, 2\), got shape \[2, 5, 2, 2, 2, 3\]", ValueError, True),
    ("weights-rank", _replace(4, lambda a: a[..., None]),
     r"attention_weights must have shape \(N, Lq, M, L, P\), got shape \[2, 5, 2, 2, 2, 1\]", ValueError, True),
    ("no-levels", _many_levels(0),
     r"spatial_shapes must have between 1 and 16 rows \(one per level\), got 0", ValueError, True),
    ("17-levels", _many_levels(17),
     r"spatial_shapes must have between 1 and 16 rows \(one per level\), got 17", ValueError, True),
    ("starts-length", _replace(2, lambda a: np.array([0, 12, 16], np.int64)),
     r"level_start_index must have L = 2 elements \(one per row of spatial_shapes\), got shape \[3\]", ValueError,
     True),
    ("loc-batch", _replace(3, lambda a: np.concatenate([a, a[:1]])),
     r"sampling_locations must have shape \(N, Lq, M, L, P, 2\) with N = value.shape\[0\] = 2, M = value.shape\[2\] "
     r"= 2 and L = spatial_shapes.shape\[0\] = 2, got shape \[3, 5, 2, 2, 2, 2\]", ValueError, True),
    ("loc-heads", _replace(3, lambda a: a[:, :, :1]),
     r"sampling_locations must have shape \(N, Lq, M, L, P, 2\) with N = value.shape\[0\] = 2, M = value.shape\[2\] "
     r"= 2 and L = spatial_shapes.shape\[0\] = 2, got shape \[2, 5, 1, 2, 2, 2\]", ValueError, True),
    ("loc-levels", _replace(3, lambda a: a[:, :, :, :1]),
     r"sampling_locations must have shape \(N, Lq, M, L, P, 2\) with N = value.shape\[0\] = 2, M = value.shape\[2\] "
     r"= 2 and L = spatial_shapes.shape\[0\] = 2, got shape \[2, 5, 2, 1, 2, 2\]", ValueError, True),
    ("weights-queries", _replace(4, lambda a: a[:, :4]),
     r"attention_weights must have shape \(N, Lq, M, L, P\) = sampling_locations.shape\[:5\] = \[2, 5, 2, 2, 2\], "
     r"got shape \[2, 4, 2, 2, 2\]", ValueError, True),
    ("weights-points", _replace(4, lambda a: a[..., :1]),
     r"attention_weights must have shape \(N, Lq, M, L, P\) = sampling_locations.shape\[:5\] = \[2, 5, 2, 2, 2\], "
     r"got shape \[2, 5, 2, 2, 1\]", ValueError, True),
    # Checks that need the contents of spatial_shapes / level_start_index (not the fake kernel's).
    ("zero-height", _levels([(0, 4), (4, 4)]),
     r"spatial_shapes\[0\] = \(0, 4\): H and W must be > 0", ValueError, False),
    ("negative-sizes", _levels([(-3, -4), (2, 2)]),
     r"spatial_shapes\[0\] = \(-3, -4\): H and W must be > 0", ValueError, False),
    ("wrong-start", _levels([(3, 4), (2, 2)], [0, 11]),
     r"level_start_index\[1\] must be 12 \(the sum of H \* W of the levels before it\), got 11", ValueError, False),
    ("first-start", _levels([(3, 4), (2, 2)], [1, 13]),
     r"level_start_index\[0\] must be 0 \(the sum of H \* W of the levels before it\), got 1", ValueError, False),
    ("sizes-sum", _levels([(3, 4), (2, 3)]),
     r"the levels' sizes must add up to S = value.shape\[1\] = 16, got sum of H \* W over spatial_shapes = 18",
     ValueError, False),
    ("huge-sizes", _levels([(2**31, 2**31), (2, 2)], [0, 2**62]),
     r"the levels' sizes must add up to S = value.shape\[1\] = 16, got sum of H \* W over spatial_shapes = "
     r"4611686018427387908", ValueError, False),
    ("overflowing-sizes", _levels([(2**32, 2**32), (2, 2)], [0, 0]),
     r"the levels' sizes must add up to S = value.shape\[1\] = 16, got sum of H \* W over spatial_shapes = more than "
     r"2\^63", ValueError, False),
    ("overflowing-sum", _levels([(2**31, 2**31), (2**31, 2**31)], [0, 2**62]),
     r"the levels' sizes must add up to S = value.shape\[1\] = 16, got sum of H \* W over spatial_shapes = more than "
     r"2\^63", ValueError, False),
]
IDS = [c[0] for c in CASES]


def bad_args(case):
    return case[1](valid_args())


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_core(case):
    from opbridge import _core

    _, _, message, exc, _ = case
    with pytest.raises(exc, match="ms_deform_attn: " + message):
        _core.ms_deform_attn(*bad_args(case))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_core_backward(case):
    from opbridge import _core

    _, _, message, exc, _ = case
    args = bad_args(case)
    go = np.ones((N, LQ, M * D), np.float32)
    with pytest.raises(exc, match="ms_deform_attn_backward: " + message):
        _core.ms_deform_attn_backward(go, *args)


def test_core_backward_grad_output_shape():
    from opbridge import _core

    with pytest.raises(ValueError, match=r"grad_output must have the output's shape \(N, Lq, M \* D\) = \[2, 5, 6\], "
                                         r"got shape \[2, 5, 5\]"):
        _core.ms_deform_attn_backward(np.ones((N, LQ, 5), np.float32), *valid_args())


# ---- ORT ----------------------------------------------------------------------------------------

_ORT_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
              np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.int64): TensorProto.INT64,
              np.dtype(np.int32): TensorProto.INT32}


def run_ort(args, session=None):
    names = ["value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"]
    # Shapes undeclared: the node's own check reports what is wrong when it runs.
    inputs = [helper.make_tensor_value_info(n, _ORT_TYPES[a.dtype], None) for n, a in zip(names, args)]
    node = helper.make_node("MultiScaleDeformableAttention", names, ["Y"], domain=opbridge.DOMAIN, name="attn")
    graph = helper.make_graph([node], "bad", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(opbridge.DOMAIN, 2)],
                              ir_version=9)
    sess = (session or opbridge.InferenceSession)(model.SerializeToString())
    return sess.run(None, dict(zip(names, args)))


@pytest.mark.parametrize("case", [c for c in CASES if c[3] is not TypeError], ids=[c[0] for c in CASES if c[3] is not TypeError])
def test_ort(case):
    with pytest.raises(Exception, match=r"ai\.opbridge::MultiScaleDeformableAttention \(node 'attn'\): " + case[2]) as info:
        run_ort(bad_args(case))
    assert type(info.value).__module__.startswith("onnxruntime")


@pytest.mark.parametrize("case", [c for c in CASES if c[3] is TypeError], ids=[c[0] for c in CASES if c[3] is TypeError])
def test_ort_types_are_checked_by_ort(case):
    """Element types are part of the kernel's registration: ORT itself refuses the node; before it
    loads the model, opbridge.InferenceSession names the input, its type and the types the op takes."""
    import onnxruntime as ort

    with pytest.raises(Exception, match=r"Type Error|no kernel def matches|Could not find an implementation"):
        run_ort(bad_args(case), lambda model: ort.InferenceSession(model, opbridge.session_options(),
                                                                   providers=["CPUExecutionProvider"]))
    with pytest.raises(ValueError, match=r"the model is invalid: .*\n  ai\.opbridge::MultiScaleDeformableAttention "
                                         r"\(node 'attn'\): input '\w+' (\(value '\w+'\) is tensor\(\w+\); "
                                         r"MultiScaleDeformableAttention takes tensor\(|is tensor\(\w+\) but '\w+' is "
                                         r"tensor\(\w+\); MultiScaleDeformableAttention takes them of one type)"):
        run_ort(bad_args(case))


# ---- torch: the op and its fake kernel ------------------------------------------------------------


def _torch(args, device="cpu"):
    import torch

    return [torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in args]


@pytest.mark.torch
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_torch(case):
    import opbridge.ops

    _, _, message, exc, _ = case
    with pytest.raises(exc, match="opbridge::ms_deform_attn: " + message):
        opbridge.ops.ms_deform_attn(*_torch(bad_args(case)))


@pytest.mark.torch
@pytest.mark.parametrize("case", [c for c in CASES if c[4]], ids=[c[0] for c in CASES if c[4]])
def test_torch_fake_kernel(case):
    """Meta tensors run the fake kernel: the checks shapes and dtypes can decide, same messages."""
    import torch

    _, _, message, exc, _ = case
    with pytest.raises(exc, match="opbridge::ms_deform_attn: " + message):
        torch.ops.opbridge.ms_deform_attn.default(*_torch(bad_args(case), "meta"))


@pytest.mark.torch
@pytest.mark.parametrize("case", [c for c in CASES if not c[4]], ids=[c[0] for c in CASES if not c[4]])
def test_torch_fake_kernel_cannot_see_values(case):
    """Checks that need the values of spatial_shapes pass on meta tensors (shape-only result)."""
    import torch

    out = torch.ops.opbridge.ms_deform_attn.default(*_torch(bad_args(case), "meta"))
    assert out.shape == (N, LQ, M * D) and out.device.type == "meta"


@pytest.mark.torch
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_torch_backward_op(case):
    import torch

    from helpers.torch_errors import raises_tagged

    _, _, message, exc, _ = case
    go = torch.ones(N, LQ, M * D)
    # torch.ops on the C++ kernel: the stable ABI's RuntimeError, tagged with the type.
    with raises_tagged(exc, "opbridge::ms_deform_attn_backward: " + message):
        torch.ops.opbridge.ms_deform_attn_backward.default(go, *_torch(bad_args(case)))


@pytest.mark.torch
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_torch_backward_grad_output_shape(device):
    import torch

    from helpers.torch_errors import raises_tagged

    go = torch.ones(N, LQ, 5, device=device)
    message = (r"opbridge::ms_deform_attn_backward: grad_output must have the output's "
               r"shape \(N, Lq, M \* D\) = \[2, 5, 6\], got shape \[2, 5, 5\]")
    # The CPU kernel (C++, stable ABI: a tagged RuntimeError) and the fake kernel (Python: ValueError).
    with raises_tagged(ValueError, message) if device == "cpu" else pytest.raises(ValueError, match=message):
        torch.ops.opbridge.ms_deform_attn_backward.default(go, *_torch(valid_args(), device))


@pytest.mark.torch
def test_torch_mixed_devices():
    """A meta tensor among CPU ones dispatches to the fake kernel, which refuses the mix."""
    import torch

    args = _torch(valid_args())
    args[3] = args[3].to("meta")
    with pytest.raises(ValueError, match=r"opbridge::ms_deform_attn: sampling_locations must be on value's device "
                                         r"\(cpu\), got meta"):
        torch.ops.opbridge.ms_deform_attn.default(*args)
