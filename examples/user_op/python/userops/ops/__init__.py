"""The torch side of userops: loads the torch extension and registers the fake kernel of each
declared op (from its declaration). LogCumSumExp has no gradient formula here: backward through
it raises a clear NotImplementedError."""

from __future__ import annotations

from typing import cast

import torch
from opbridge.ops import load_package_ops, translate_errors

# Loads the torch extension and registers the fake kernels; the package has no op modules.
__all__ = ["log_cumsum_exp", *load_package_ops(globals())]


# The kernel's errors cross the stable ABI as RuntimeError tagged with their type; this raises the type.
@translate_errors
def log_cumsum_exp(x: torch.Tensor, dim: int) -> torch.Tensor:
    """log(cumsum(exp(x), dim)), computed stably (like torch.logcumsumexp); float32/float64, CPU.
    Exports to ONNX as com.example.userops::LogCumSumExp (attribute axis = dim)."""
    return cast(torch.Tensor, torch.ops.userops.log_cumsum_exp.default(x, dim))
