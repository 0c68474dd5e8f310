"""The torch side of myops: importing it loads the torch extension and registers, per op, its
autograd formula (the op's module here) and its fake kernel (from the op's declaration).
Every module in this package is one op; its public functions are re-exported here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opbridge.ops import load_package_ops

__all__ = load_package_ops(globals())

# The same functions as type checkers see them (load_package_ops imports them at run time, after
# loading the torch extension); `opbridge new-op` adds a line here for each op it adds.
if TYPE_CHECKING:
    from .rms_norm import rms_norm as rms_norm
