"""Bad point-cloud op calls, each with the message every runtime must give (torch, the fake kernel,
ONNX Runtime's CPU and CUDA providers, _core), and the single-node ONNX model of a call."""

from __future__ import annotations

import numpy as np
import opbridge
from onnx import TensorProto, helper


def _pts(*shape):
    return np.random.default_rng(1).uniform(-1, 1, shape).astype(np.float32)


# (id, op, onnx type, args in torch order, attribute names, message, shapes alone decide it)
BAD = [
    ("fps-m>n", "furthest_point_sample", "FurthestPointSample", [_pts(2, 5, 3), 6], ["num_points"],
     r"num_points must be <= N = points_xyz.shape\[1\] = 5, got num_points = 6", True),
    ("fps-empty", "furthest_point_sample", "FurthestPointSample", [_pts(2, 0, 3), 1], ["num_points"],
     r"num_points must be <= N = points_xyz.shape\[1\] = 0, got num_points = 1", True),
    ("fps-last-dim", "furthest_point_sample", "FurthestPointSample", [_pts(2, 5, 2), 2], ["num_points"],
     r"points_xyz must have shape \(B, N, 3\), got points_xyz.shape\[2\] = 2", True),
    ("bq-radius", "ball_query", "BallQuery", [0.0, 0.0, 4, _pts(2, 5, 3), _pts(2, 3, 3)],
     ["min_radius", "max_radius", "sample_num"], r"max_radius must be > 0, got 0", True),
    ("bq-min-radius", "ball_query", "BallQuery", [0.5, 0.25, 4, _pts(2, 5, 3), _pts(2, 3, 3)],
     ["min_radius", "max_radius", "sample_num"], r"min_radius must be >= 0 and < max_radius = 0.25, got 0.5", True),
    # Float attributes are float32 everywhere (as ONNX stores them): 0.3 and the double nearest
    # float32(0.3) are one radius, refused as an empty shell by torch as by ONNX Runtime.
    ("bq-float32-radii", "ball_query", "BallQuery", [0.3, 0.30000001192092896, 4, _pts(2, 5, 3), _pts(2, 3, 3)],
     ["min_radius", "max_radius", "sample_num"],
     r"min_radius must be >= 0 and < max_radius = 0.30000001192092896, got 0.30000001192092896", True),
    ("bq-batch", "ball_query", "BallQuery", [0.0, 1.0, 4, _pts(2, 5, 3), _pts(3, 3, 3)],
     ["min_radius", "max_radius", "sample_num"],
     r"center_xyz must have B = xyz.shape\[0\] = 2 clouds, got center_xyz.shape\[0\] = 3", True),
    ("bq-empty", "ball_query", "BallQuery", [0.0, 1.0, 4, _pts(2, 0, 3), _pts(2, 3, 3)],
     ["min_radius", "max_radius", "sample_num"],
     r"xyz must hold at least one point \(N >= 1\) for its centers, got N = 0", True),
    ("knn-k>n", "knn", "KNN", [6, _pts(2, 5, 3), _pts(2, 3, 3)], ["k"],
     r"k must be <= N = xyz.shape\[1\] = 5, got k = 6", True),
    ("knn-k0", "knn", "KNN", [0, _pts(2, 5, 3), _pts(2, 3, 3)], ["k"], r"k must be >= 1, got 0", True),
    ("three-nn-m<3", "three_nn", "ThreeNN", [_pts(2, 5, 3), _pts(2, 2, 3)], [],
     r"source must hold at least 3 points \(M >= 3\), got source.shape\[1\] = 2", True),
    ("gather-index", "gather_points", "GatherPoints",
     [_pts(2, 3, 5), np.array([[0, 1], [4, 5]], np.int64)], [],
     r"indices\[1, 1\] = 5 is outside \[0, N = features.shape\[2\] = 5\)", False),
    ("grouping-negative", "grouping_operation", "GroupingOperation",
     [_pts(2, 3, 5), np.array([[[0, 1]], [[-1, 2]]], np.int32)], [],
     r"indices\[1, 0, 0\] = -1 is outside \[0, N = features.shape\[2\] = 5\)", False),
    ("grouping-batch", "grouping_operation", "GroupingOperation",
     [_pts(2, 3, 5), np.zeros((3, 1, 2), np.int64)], [],
     r"indices must have B = features.shape\[0\] = 2 rows, got indices.shape\[0\] = 3", True),
    ("interp-index", "three_interpolate", "ThreeInterpolate",
     [_pts(1, 2, 4), np.array([[[0, 1, 4]]], np.int64), _pts(1, 1, 3)], [],
     r"indices\[0, 0, 2\] = 4 is outside \[0, M = features.shape\[2\] = 4\)", False),
    ("interp-weight", "three_interpolate", "ThreeInterpolate",
     [_pts(1, 2, 4), np.array([[[0, 1, 2]]], np.int64), _pts(1, 2, 3)], [],
     r"weight must have the shape of indices \[1, 1, 3\], got shape \[1, 2, 3\]", True),
]
BAD_IDS = [c[0] for c in BAD]
_ORT = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64,
        np.dtype(np.int32): TensorProto.INT32}


def single_node_model(op, onnx_type, args, attr_names, float_type=TensorProto.FLOAT):
    """(serialized model, feeds) of one ai.opbridge node called with `args` in torch's order
    (arrays become inputs in0, in1, ...; the rest attributes named by attr_names); float inputs
    and outputs of type float_type."""
    tensors = [a for a in args if isinstance(a, np.ndarray)]
    attrs = dict(zip(attr_names, [a for a in args if not isinstance(a, np.ndarray)]))
    names = [f"in{i}" for i in range(len(tensors))]
    outputs = ["out0", "out1"] if op == "three_nn" else ["out0"]
    elem = {**_ORT, np.dtype(np.float32): float_type, np.dtype(np.float16): TensorProto.FLOAT16}
    inputs = [helper.make_tensor_value_info(n, elem[a.dtype], None) for n, a in zip(names, tensors)]
    node = helper.make_node(onnx_type, names, outputs, domain=opbridge.DOMAIN, name="n", **attrs)
    types = {"three_nn": [float_type, TensorProto.INT64]}.get(
        op, [TensorProto.INT64] if op in ("furthest_point_sample", "ball_query", "knn") else [float_type])
    graph = helper.make_graph([node], "one", inputs, [helper.make_tensor_value_info(o, t, None)
                                                      for o, t in zip(outputs, types)])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(opbridge.DOMAIN, 3)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=9)
    return model.SerializeToString(), dict(zip(names, tensors))
