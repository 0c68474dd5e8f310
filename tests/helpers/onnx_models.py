"""Hand-built ONNX models (no torch needed), for ORT-side tests and older-ORT matrices."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

# ORT 1.31 refuses IR 14 (onnx 1.23's default); IR 9 / opset 20 load on every ORT >= 1.17.
IR_VERSION = 9
DEFAULT_OPSET = 17

NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
}


def single_node_model(op_type, domain, inputs, attrs=None, n_outputs=1, out_dtype=None, domain_version=1,
                      opset=DEFAULT_OPSET):
    """A model with one node. inputs: list of (name, numpy dtype, shape) or None for an omitted
    optional input. Shapes may hold strings (symbolic dims) or None (unknown)."""
    node_inputs, graph_inputs = [], []
    for spec in inputs:
        if spec is None:
            node_inputs.append("")
            continue
        name, dtype, shape = spec
        node_inputs.append(name)
        graph_inputs.append(helper.make_tensor_value_info(name, NP_TO_ONNX[np.dtype(dtype)], shape))
    out_type = NP_TO_ONNX[np.dtype(out_dtype or inputs[0][1])]
    outputs = [helper.make_tensor_value_info(f"Y{i}" if n_outputs > 1 else "Y", out_type, None) for i in range(n_outputs)]
    node = helper.make_node(op_type, node_inputs, [o.name for o in outputs], domain=domain, **(attrs or {}))
    graph = helper.make_graph([node], f"{op_type}_test", graph_inputs, outputs)
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, domain_version))
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


def serialize(model: onnx.ModelProto) -> bytes:
    return model.SerializeToString()
