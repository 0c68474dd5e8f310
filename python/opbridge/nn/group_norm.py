from __future__ import annotations

import torch

from .. import ops


class GroupNorm(torch.nn.GroupNorm):
    """Drop-in for ``torch.nn.GroupNorm``: same constructor, parameters and state_dict keys
    (``weight``, ``bias``), computed by ``opbridge.ops.group_norm`` and exported to ONNX as
    ``ai.opbridge::GroupNorm``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return ops.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    @classmethod
    def from_torch(cls, m: torch.nn.GroupNorm) -> "GroupNorm":
        """A GroupNorm sharing ``m``'s parameters."""
        new = cls.__new__(cls)
        new.__dict__.update(m.__dict__)
        return new
