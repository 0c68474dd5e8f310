"""Helpers of the optimize / fusion / external-data tests (torch-free): an independent float64
evaluator for rewritten models and a probe for the ORT library's GroupNorm activation."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import opbridge
from helpers.onnx_models import IR_VERSION
from helpers.reference import group_norm as ref_group_norm


def silu(y: np.ndarray) -> np.ndarray:
    return y / (1.0 + np.exp(-y))


def group_norm_act_ref(x, num_groups, weight=None, bias=None, eps=1e-5, activation="none"):
    """GroupNorm (tests/helpers/reference.py) then the activation, in float64."""
    y = ref_group_norm(x, num_groups, weight, bias, eps)
    if activation == "silu":
        y = silu(y)
    elif activation != "none":
        raise ValueError(f"unknown activation {activation!r}")
    return y


def _opbridge_group_norm_op():
    from onnx.reference.op_run import OpRun

    class GroupNorm(OpRun):
        op_domain = opbridge.DOMAIN
        op_schema = None  # evaluate what the node says; onnx's name-only schema lookup is not needed

        def _run(self, X, scale=None, bias=None, num_groups=None, epsilon=None, activation=None):
            if isinstance(activation, bytes):
                activation = activation.decode()
            y = group_norm_act_ref(X, int(num_groups), scale, bias, 1e-5 if epsilon is None else float(epsilon),
                                   activation or "none")
            return (y.astype(X.dtype),)

    return GroupNorm


def reference_run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """Runs a model with onnx's reference evaluator, ai.opbridge::GroupNorm (with its activation)
    from the float64 reference: checks a rewritten graph independently of opbridge's kernels."""
    from onnx.reference import ReferenceEvaluator

    return [np.asarray(v) for v in ReferenceEvaluator(model, new_ops=[_opbridge_group_norm_op()]).run(None, feeds)]


@functools.lru_cache(maxsize=None)
def ort_applies_silu() -> bool:
    """Whether opbridge's ORT library applies GroupNorm's activation="silu" (ai.opbridge version 2)."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 4, 3])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 4, 3])
    node = helper.make_node("GroupNorm", ["X"], ["Y"], domain=opbridge.DOMAIN, num_groups=2, activation="silu")
    model = helper.make_model(helper.make_graph([node], "probe", [x], [y]), ir_version=IR_VERSION,
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(opbridge.DOMAIN, 2)])
    data = np.random.default_rng(0).standard_normal((2, 4, 3)).astype(np.float32)
    try:
        got = opbridge.InferenceSession(model).run(None, {"X": data})[0]
    except Exception:
        return False
    return bool(np.allclose(got, group_norm_act_ref(data, 2, activation="silu"), atol=1e-4))


needs_ort_silu = pytest.mark.skipif(
    "not __import__('helpers.optimize_support').optimize_support.ort_applies_silu()",
    reason="opbridge's ORT library does not apply GroupNorm's activation attribute yet "
    "(ai.opbridge GroupNorm version 2); the fused graph is checked against the float64 reference instead",
)


def group_norm_decomposition_with_table(rng, channels, groups, spatial, table_rows=16, name="gn_table"):
    """A model optimize rewrites and a tensor it leaves alone: the TorchScript exporter's GroupNorm
    decomposition (Reshape -> InstanceNormalization -> Reshape -> Mul -> Add) of x (N, channels,
    *spatial), and a float32 table of table_rows x 1024 that is only gathered from (input idx).
    Returns (model, weight, bias, table)."""
    w, b = rng.uniform(0.5, 1.5, channels), rng.uniform(-0.5, 0.5, channels)
    table = rng.standard_normal((table_rows, 1024)).astype(np.float32)
    inits = [numpy_helper.from_array(np.array([0, groups, -1], np.int64), "gs"),
             numpy_helper.from_array(np.ones(groups, np.float32), "ones"),
             numpy_helper.from_array(np.zeros(groups, np.float32), "zeros"),
             numpy_helper.from_array(w.astype(np.float32).reshape(channels, 1, 1), "w"),
             numpy_helper.from_array(b.astype(np.float32).reshape(channels, 1, 1), "b"),
             numpy_helper.from_array(table, "table")]
    nodes = [helper.make_node("Reshape", ["x", "gs"], ["r"]),
             helper.make_node("InstanceNormalization", ["r", "ones", "zeros"], ["n"]),
             helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Reshape", ["n", "s"], ["rr"]),
             helper.make_node("Mul", ["rr", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["y"]),
             helper.make_node("Gather", ["table", "idx"], ["e"])]
    shape = ["N", channels, *spatial]
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape),
         helper.make_tensor_value_info("idx", TensorProto.INT64, ["K"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape),
         helper.make_tensor_value_info("e", TensorProto.FLOAT, ["K", 1024])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    return model, w, b, table
