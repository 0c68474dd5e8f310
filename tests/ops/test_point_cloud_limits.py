"""Outputs too large to exist: ball_query's sample_num sizes its output alone, and a value whose
element count overflows int64 passes every check of the declaration. torch and ONNX Runtime
must both refuse it with an error that says what was asked for, never crash."""

from __future__ import annotations

import numpy as np
import opbridge
import pytest
import torch
from onnx import TensorProto, helper
from opbridge import ops

HUGE = 2**62  # x 4 centers: more than 2^63 elements


def test_torch_refuses_an_output_too_large_with_its_shape():
    x = torch.rand(1, 4, 3)
    with pytest.raises(RuntimeError, match=r"cannot allocate an output of shape \[1, 4, 4611686018427387904\] "
                                           r"\(more than 2\^63 bytes\) on cpu"):
        ops.ball_query(0.0, 1.0, HUGE, x, x)


def test_onnxruntime_refuses_an_output_too_large():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)
    node = helper.make_node("BallQuery", ["x", "x"], ["y"], domain=opbridge.DOMAIN, name="n", min_radius=0.0,
                            max_radius=1.0, sample_num=HUGE)
    graph = helper.make_graph([node], "g", [x], [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(opbridge.DOMAIN, 3)], ir_version=9)
    sess = opbridge.InferenceSession(model.SerializeToString())
    with pytest.raises(Exception, match=r"BallQuery node\. Name:'n'.*(Integer overflow|overflowed)"):
        sess.run(None, {"x": np.random.default_rng(0).random((1, 4, 3), dtype=np.float32)})
