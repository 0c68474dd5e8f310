"""Errors of the torch kernels through the stable ABI (opbridge/ops/_errors.py): a call of
``torch.ops.<ns>.*`` that reaches a C++ kernel raises RuntimeError tagged with the exception type
the error stands for; opbridge.ops raises that type. Fake (meta) kernels are Python and raise the
type itself."""

from __future__ import annotations

import contextlib
import re

import pytest


def tag_of(exc: type) -> str:
    import torch

    return "LinAlgError" if exc is torch.linalg.LinAlgError else exc.__name__


@contextlib.contextmanager
def raises_tagged(exc: type, match: str):
    """pytest.raises for a torch op's C++ kernel: a plain RuntimeError whose message is
    "<exc's tag>: ..." and contains `match` (a regex, searched), and which opbridge.ops would
    raise as `exc` with the message less the tag."""
    from opbridge.ops._errors import translated

    with pytest.raises(RuntimeError) as info:
        yield info
    msg = str(info.value)
    assert type(info.value) is RuntimeError, type(info.value)
    assert msg.startswith(tag_of(exc) + ": "), msg
    assert re.search(match, msg), (match, msg)
    assert type(translated(info.value)) is exc
