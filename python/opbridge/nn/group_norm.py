from __future__ import annotations

import inspect

import torch

from .. import ops
from ..ops.group_norm import ACTIVATIONS, DEFAULT_EPS


class GroupNorm(torch.nn.GroupNorm):
    """Drop-in for ``torch.nn.GroupNorm``: same constructor, parameters and state_dict keys
    (``weight``, ``bias``), computed by ``opbridge.ops.group_norm`` and exported to ONNX as
    ``ai.opbridge::GroupNorm``.

    ``activation="silu"`` makes the module compute ``SiLU(GroupNorm(x))`` in one pass (what
    ``torch.nn.Sequential(torch.nn.GroupNorm(...), torch.nn.SiLU())`` computes); the state_dict is
    unchanged by it; like every argument torch's GroupNorm does not have, it is keyword-only. The
    output keeps a channels-last input's memory format."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = DEFAULT_EPS, affine: bool = True,
                 device: torch.device | str | int | None = None, dtype: torch.dtype | None = None, *,
                 bias: bool = True, activation: str = "none") -> None:
        _check_activation(activation)
        if _TORCH_TAKES_BIAS:
            super().__init__(num_groups, num_channels, eps, affine, device, dtype, bias=bias)
        elif not bias:
            raise TypeError(f"opbridge.nn.GroupNorm: bias=False needs a torch whose nn.GroupNorm takes bias "
                            f"(this one, {torch.__version__}, does not)")
        else:
            super().__init__(num_groups, num_channels, eps, affine, device, dtype)
        self.activation = activation

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return ops.group_norm(input, self.num_groups, self.weight, self.bias, self.eps, self.activation)

    def extra_repr(self) -> str:
        r = super().extra_repr()
        return r if self.activation == "none" else f"{r}, activation={self.activation!r}"

    @classmethod
    def from_torch(cls, m: torch.nn.GroupNorm, activation: str = "none") -> "GroupNorm":
        """A GroupNorm sharing ``m``'s parameters (and, for an opbridge GroupNorm, taking its
        activation unless ``activation`` is given)."""
        _check_activation(activation)
        new = cls.__new__(cls)
        new.__dict__.update(m.__dict__)
        new.activation = activation if activation != "none" else getattr(m, "activation", "none")
        return new


# torch.nn.GroupNorm takes `bias` (keyword-only) in newer releases (2.13 does, 2.11 does not); ours
# takes what the installed one takes, so that it stays a drop-in for it.
_TORCH_TAKES_BIAS = "bias" in inspect.signature(torch.nn.GroupNorm.__init__).parameters


def _check_activation(activation: str) -> None:
    if activation not in ACTIVATIONS:
        names = " or ".join(repr(a) for a in ACTIVATIONS)
        raise ValueError(f"opbridge.nn.GroupNorm: activation must be {names}, got {activation!r}")
