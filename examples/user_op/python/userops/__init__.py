"""userops: LogCumSumExp, an op of our own built on opbridge (see examples/user_op/).

    import userops
    y = userops.log_cumsum_exp(x, dim=-1)              # torch (CPU)
    opbridge.onnx.export(model, (x,), "m.onnx")        # -> com.example.userops::LogCumSumExp
    so = userops.session_options()                      # ORT: userops' and opbridge's ops
"""

from __future__ import annotations

from pathlib import Path

import torch

import opbridge
import opbridge.onnx

DOMAIN = "com.example.userops"
_HERE = Path(__file__).resolve().parent

torch.ops.load_library(str(_HERE / "libuserops_torch.so"))


def ort_library_path() -> str:
    """The ORT custom-op library with userops' ops (domain com.example.userops)."""
    return str(_HERE / "libuserops_ort.so")


def session_options(so=None):
    """onnxruntime.SessionOptions with userops' and opbridge's ops registered."""
    so = opbridge.session_options(so)
    so.register_custom_ops_library(ort_library_path())
    return so


def log_cumsum_exp(x: torch.Tensor, dim: int) -> torch.Tensor:
    """log(cumsum(exp(x), dim)), computed stably (like torch.logcumsumexp); float32/float64, CPU."""
    return torch.ops.userops.log_cumsum_exp.default(x, dim)


@torch.library.register_fake("userops::log_cumsum_exp")
def _log_cumsum_exp_fake(x, dim):
    torch._check(x.dim() >= 1, lambda: "userops::log_cumsum_exp: x must have rank >= 1, got a scalar")
    torch._check(-x.dim() <= dim < x.dim(),
                 lambda: f"userops::log_cumsum_exp: dim must be in [-{x.dim()}, {x.dim()}), got {dim}")
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# The export glue: torch's `dim` argument becomes the ONNX attribute `axis`.
LOG_CUMSUM_EXP = opbridge.onnx.declare_op(
    "userops::log_cumsum_exp", domain=DOMAIN, op_type="LogCumSumExp", attributes={"dim": "axis"},
    dtypes=("tensor(float)", "tensor(double)"),
    doc="log(cumsum(exp(X), axis)), computed stably (running maximum).",
)
