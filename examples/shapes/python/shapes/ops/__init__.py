"""The torch side of shapes: importing it loads the torch extension and registers, per op, its
autograd formula (the op's module here) and its fake kernel (from the op's declaration).
Every module in this package is one op; its public functions are re-exported here."""

from __future__ import annotations

from opbridge.ops import load_package_ops

__all__ = load_package_ops(globals())
