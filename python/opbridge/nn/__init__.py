"""torch.nn modules backed by opbridge ops (drop-in replacements for their torch.nn twins)."""

from __future__ import annotations

from .group_norm import GroupNorm
from .convert import ConvertReport, convert

__all__ = ["ConvertReport", "GroupNorm", "convert"]
