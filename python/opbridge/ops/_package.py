"""The torch side of an op package (opbridge's own ``opbridge.ops`` and those ``opbridge new-op``
makes): every public module of the package is one op, whose public functions the package
re-exports, so adding an op means adding a module."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from .._op_package import package_library
from ._torch_adapter import register_library_ops

__all__ = ["load_op_modules", "load_package_ops"]


def load_op_modules(namespace: dict[str, Any]) -> list[str]:
    """Imports every public module of the package whose ``globals()`` is ``namespace`` and puts
    their ``__all__`` names into it; returns those names."""
    names: list[str] = []
    for m in pkgutil.iter_modules(namespace["__path__"]):
        if m.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{namespace['__name__']}.{m.name}")
        for name in getattr(mod, "__all__", []):
            namespace[name] = getattr(mod, name)
            names.append(name)
    return names


def load_package_ops(namespace: dict[str, Any]) -> list[str]:
    """The whole ``ops/__init__.py`` of an op package (``__all__ = load_package_ops(globals())``):
    loads the torch extension of the parent package's library (see ``opbridge.op_package``),
    imports the op modules (each registers its autograd formula) and re-exports their public
    names, then registers every declared op's fake kernel, and a clear error on backward for ops
    that registered no formula. Returns the re-exported names."""
    parent = namespace["__name__"].rpartition(".")[0]
    library = package_library(parent)
    library.load_torch()
    names = load_op_modules(namespace)
    # After the op modules registered their autograd formulas.
    register_library_ops(library)
    return names
