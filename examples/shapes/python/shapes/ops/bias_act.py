"""shapes::bias_act in torch: the Python function and the autograd formula."""

from __future__ import annotations

import torch
from opbridge.ops import register_autograd, translate_errors

__all__ = ["bias_act"]


# translate_errors: the kernels' errors reach Python through the stable ABI as RuntimeError tagged
# with their type ("ValueError: shapes::bias_act: ..."); this function raises that type.
@translate_errors
def bias_act(x: torch.Tensor, bias: torch.Tensor | None = None, activation: str = "none") -> torch.Tensor:
    """y = activation(x + bias): bias optional, one per channel (the last dimension of x); activation
    "none", "relu" or "tanh"; float32/float64. Exports to ONNX as com.example.shapes::BiasAct."""
    return torch.ops.shapes.bias_act.default(x, bias, activation)


def _setup_context(ctx, inputs, output):
    x, bias, activation = inputs
    ctx.save_for_backward(x, bias)
    ctx.activation = activation


def _backward(ctx, grad):
    # First-order gradients from the C++ backward kernel (bias's only where it was given).
    x, bias = ctx.saved_tensors
    grad_x, grad_bias = torch.ops.shapes.bias_act_backward.default(grad, x, bias, ctx.activation)
    return grad_x, grad_bias if bias is not None else None, None


def _differentiable(x, bias=None, activation="none"):
    # The op in torch ops: higher-order gradients (double backward) differentiate this.
    z = x if bias is None else x + bias
    return torch.relu(z) if activation == "relu" else torch.tanh(z) if activation == "tanh" else z


# backward_op: the same first-order gradients as _backward (those of x and bias, arguments 0 and 1),
# computed by calling bias_act_backward(grad, x, bias, activation) from a graph built in C++, with no
# Python in the forward or the backward; _backward serves the rest (create_graph=True).
register_autograd("shapes::bias_act", _backward, setup_context=_setup_context, double_backward=_differentiable,
                  backward_op="shapes::bias_act_backward", backward_op_grads=(0, 1))
