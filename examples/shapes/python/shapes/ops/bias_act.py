"""shapes::bias_act in torch: the Python function and the differentiable form of the backward."""

from __future__ import annotations

from typing import cast

import torch
from opbridge.ops import register_gradient, translate_errors

__all__ = ["bias_act"]


# translate_errors: the kernels' errors reach Python through the stable ABI as RuntimeError tagged
# with their type ("ValueError: shapes::bias_act: ..."); this function raises that type.
@translate_errors
def bias_act(x: torch.Tensor, bias: torch.Tensor | None = None, activation: str = "none") -> torch.Tensor:
    """y = activation(x + bias): bias optional, one per channel (the last dimension of x); activation
    "none", "relu" or "tanh"; float32/float64. Exports to ONNX as com.example.shapes::BiasAct."""
    return cast(torch.Tensor, torch.ops.shapes.bias_act.default(x, bias, activation))


def _backward(grad: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None = None,
              activation: str = "none") -> tuple[torch.Tensor, torch.Tensor]:
    # bias_act_backward in differentiable torch ops, for gradients of any order (create_graph=True);
    # first-order gradients run the C++ backward op itself. Without bias, its gradient is unused.
    z = x if bias is None else x + bias
    if activation == "relu":
        grad = grad * (z > 0)
    elif activation == "tanh":
        grad = grad * (1 - torch.tanh(z) ** 2)
    return grad, grad.reshape(-1, x.shape[-1]).sum(0)


# The autograd formula from the backward op's declaration (gradient_of).
register_gradient("shapes::bias_act", differentiable=_backward)
