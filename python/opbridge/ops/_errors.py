"""Exception types of the torch ops, across the LibTorch stable ABI.

The torch extension is built on the stable ABI, through which every C++ error reaches Python as
RuntimeError. opbridge's kernels (and users' kernels built on opbridge's torch adapter) tag the
message with the exception type the error stands for::

    RuntimeError: ValueError: opbridge::group_norm: num_groups must divide ...

``torch.ops.<namespace>.*`` and compiled graphs raise that RuntimeError. The Python API
(``opbridge.ops.*``, ``opbridge.nn.*``, and users' op functions that use :func:`translate_errors`)
raises the type the tag names, with the rest of the message::

    ValueError: opbridge::group_norm: num_groups must divide ...

The tags (cpp/torch/torch_common.h: k*Tag): ValueError, TypeError, NotImplementedError,
LinAlgError (torch.linalg.LinAlgError). An untagged RuntimeError stays as it is.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NoReturn, TypeVar

import torch

__all__ = ["raise_translated", "translate_errors", "translated"]

_TAGS: dict[str, type[Exception]] = {
    "ValueError": ValueError,
    "TypeError": TypeError,
    "NotImplementedError": NotImplementedError,
    "LinAlgError": torch.linalg.LinAlgError,  # type: ignore[attr-defined]  # torch's stub does not export it
}

F = TypeVar("F", bound=Callable[..., Any])


def translated(error: RuntimeError) -> Exception | None:
    """The exception a tagged RuntimeError stands for (None when it carries no tag)."""
    tag, sep, rest = str(error).partition(": ")
    cls = _TAGS.get(tag) if sep else None
    return None if cls is None else cls(rest)


def raise_translated(error: RuntimeError) -> None:
    """Raises the exception a tagged RuntimeError stands for; returns for an untagged one (the
    caller re-raises it)::

        try:
            return torch.ops.myops.my_op.default(x)
        except RuntimeError as e:
            raise_translated(e)
            raise
    """
    t = translated(error)
    if t is not None:
        _raise(t)


def _raise(t: Exception) -> NoReturn:
    raise t from None


def translate_errors(fn: F) -> F:
    """Decorator: ``fn``'s tagged RuntimeErrors raised as the exceptions they stand for."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RuntimeError as e:
            raise_translated(e)
            raise

    return wrapper  # type: ignore[return-value]
