from __future__ import annotations

import warnings

import torch

from . import ms_deform_attn as _msda
from .group_norm import GroupNorm

# torch.nn module type -> its opbridge replacement (which has a from_torch classmethod).
_REPLACEMENTS = {torch.nn.GroupNorm: GroupNorm}


def _replacement(m: torch.nn.Module) -> torch.nn.Module | None:
    repl = _REPLACEMENTS.get(type(m))
    if repl is not None:
        return repl.from_torch(m)
    return _msda.replacement_for(m)


def convert(model: torch.nn.Module) -> torch.nn.Module:
    """Replaces, in place, every module that opbridge provides a twin for by that twin sharing the
    same parameters, buffers and submodules (state_dict unchanged), and returns the model (a new
    module when ``model`` itself is one that gets replaced). Covered: torch.nn.GroupNorm and the
    multi-scale deformable attention modules of transformers, mmcv and Deformable-DETR (see
    docs/ms_deform_attn.md). Only the model changes: no library function is patched.

    Deformable-attention modules of other, unrecognised designs are left as they are and named in
    one warning."""
    unknown: list[str] = []
    new = _replacement(model)
    if new is not None:
        return new
    if not _convert(model, "", unknown) and _msda.looks_like_msda(model):
        unknown.append(type(model).__qualname__)
    if unknown:
        names = sorted(set(unknown))
        warnings.warn("opbridge.nn.convert: left unconverted (deformable-attention modules of a form opbridge does "
                      f"not recognise; they run as before): {', '.join(names)}", stacklevel=2)
    return model


def _convert(module: torch.nn.Module, prefix: str, unknown: list[str]) -> bool:
    """Converts module's descendants; True when any was replaced. A deformable-attention-looking
    module with nothing replaced inside it goes to ``unknown``."""
    converted = False
    for name, child in module.named_children():
        new = _replacement(child)
        if new is not None:
            setattr(module, name, new)
            converted = True
            continue
        inner = _convert(child, f"{prefix}{name}.", unknown)
        if not inner and _msda.looks_like_msda(child):
            unknown.append(type(child).__qualname__)
        converted = converted or inner
    return converted
