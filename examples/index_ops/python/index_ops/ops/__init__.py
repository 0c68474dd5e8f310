"""The torch side of index_ops: importing it loads the torch extension and registers, per op, its
autograd formula (the op's module here) and its fake kernel (from the op's declaration).
Every module in this package is one op; its public functions are re-exported here."""

from __future__ import annotations

import importlib
import pkgutil

from opbridge.ops import register_library_ops

from .. import library

_library = library()
_library.load_torch()

__all__: list[str] = []
for _m in pkgutil.iter_modules(__path__):
    if not _m.name.startswith("_"):
        _mod = importlib.import_module(f".{_m.name}", __name__)
        for _name in getattr(_mod, "__all__", []):
            globals()[_name] = getattr(_mod, _name)
            __all__.append(_name)

# After the op modules registered their autograd formulas (ops without one get a clear error).
register_library_ops(_library)
