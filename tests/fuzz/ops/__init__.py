"""Per-op fuzz modules, discovered by name: every module here defines OP (the snake_case op
name) and the hypothesis strategies ort_cases() and torch_cases() (each yielding harness.Case).
Adding an op's fuzzing means adding one module."""

from __future__ import annotations

import importlib
import pkgutil

OPS = {}
for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _info.name.startswith("_"):
        _mod = importlib.import_module(f"{__name__}.{_info.name}")
        OPS[_mod.OP] = _mod
