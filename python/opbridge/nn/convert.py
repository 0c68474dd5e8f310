from __future__ import annotations

import torch

from .group_norm import GroupNorm

# torch.nn module type -> its opbridge replacement (which has a from_torch classmethod).
_REPLACEMENTS = {torch.nn.GroupNorm: GroupNorm}


def convert(model: torch.nn.Module) -> torch.nn.Module:
    """Replaces, in place, every torch.nn module that opbridge provides (e.g. nn.GroupNorm) by
    its opbridge twin sharing the same parameters, and returns the model (a new module when
    ``model`` itself is one that gets replaced)."""
    repl = _REPLACEMENTS.get(type(model))
    if repl is not None:
        return repl.from_torch(model)
    for name, child in model.named_children():
        repl = _REPLACEMENTS.get(type(child))
        if repl is not None:
            setattr(model, name, repl.from_torch(child))
        else:
            convert(child)
    return model
