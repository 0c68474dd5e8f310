"""Discovery of the op libraries installed packages announce: entry points of group
``opbridge.libraries`` (the packages ``opbridge new-op`` makes have one), each loaded with torch
hidden and a time limit, so that a slow or broken package is named and skipped, never fatal."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from ._op_library import OpLibrary, register_library

__all__ = ["DISCOVER_TIMEOUT_ENV", "DISCOVER_TIMEOUT_S", "SkippedEntryPoint", "discover", "discover_timeout"]

# How long one ``opbridge.libraries`` entry point may take to import and answer (seconds), unless
# OPBRIDGE_DISCOVER_TIMEOUT says otherwise. A package made by ``opbridge new-op`` answers in
# milliseconds (its ``_library`` module reads two paths); importing torch takes seconds, and is
# what the limit guards against along with packages that hang. 5 s leaves a slow, loaded machine
# a wide margin before a working package is skipped.
DISCOVER_TIMEOUT_S = 5.0
DISCOVER_TIMEOUT_ENV = "OPBRIDGE_DISCOVER_TIMEOUT"


@dataclass
class SkippedEntryPoint:
    """An ``opbridge.libraries`` entry point :func:`discover` did not register, and why."""

    name: str  # the entry point's name
    value: str  # "module:attr"
    package: str  # the distribution that declares it ("?" where unknown)
    reason: str

    def __str__(self) -> str:
        return (f"package {self.package} (entry point opbridge.libraries: {self.name} = {self.value}): "
                f"{self.reason}")


def discover_timeout() -> float:
    """Seconds one entry point may take: OPBRIDGE_DISCOVER_TIMEOUT, or DISCOVER_TIMEOUT_S."""
    text = os.environ.get(DISCOVER_TIMEOUT_ENV, "").strip()
    if not text:
        return DISCOVER_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{DISCOVER_TIMEOUT_ENV} must be a number of seconds > 0, got {text!r}")
    return value


@contextlib.contextmanager
def _torch_hidden() -> Iterator[bool]:
    # None in sys.modules makes `import torch` raise ImportError and importlib.util.find_spec
    # ("torch") return None, so a package that loads its torch side when torch is installed skips
    # it (as the packages older `opbridge new-op` made do). A process that has already imported
    # torch keeps it. Yields whether torch is hidden.
    if "torch" in sys.modules:
        yield False
        return
    sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        yield True
    finally:
        if "torch" in sys.modules and sys.modules["torch"] is None:
            del sys.modules["torch"]


class _Unusable(Exception):
    """An entry point that gave no library; the message says why, in full."""


def _load_spec(ep: Any, timeout: float) -> Any:
    """Imports the entry point and calls it, in a thread given ``timeout`` seconds. Returns the
    spec; raises _Unusable (too slow, SystemExit), or what the import or the call raised."""
    box: dict[str, Any] = {}

    def load() -> None:
        try:
            box["spec"] = ep.load()()
        except BaseException as e:  # noqa: BLE001  (SystemExit too: a package's problem, not ours)
            box["error"] = e

    # A daemon thread: one that never returns (a package that hangs at import) is left behind and
    # does not keep the process alive.
    t = threading.Thread(target=load, name=f"opbridge-discover-{ep.name}", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise _Unusable(f"importing it and calling it took over {timeout:g} s (the limit, "
                           f"{DISCOVER_TIMEOUT_ENV}); opbridge stopped waiting")
    error = box.get("error")
    if error is not None:
        if not isinstance(error, Exception):  # SystemExit and friends: reported like the others
            raise _Unusable(f"it raised {type(error).__name__}({error})") from error
        raise error
    return box["spec"]


def _discover() -> tuple[list[OpLibrary], list[SkippedEntryPoint]]:
    from importlib.metadata import entry_points

    timeout = discover_timeout()
    found: list[OpLibrary] = []
    skipped: list[SkippedEntryPoint] = []
    with _torch_hidden() as torch_hidden:
        for ep in entry_points(group="opbridge.libraries"):
            dist = getattr(ep, "dist", None)
            package = getattr(dist, "name", None) or ep.value.split(":", 1)[0].split(".", 1)[0] or "?"
            try:
                spec = _load_spec(ep, timeout)
                if not isinstance(spec, Mapping) or not isinstance(spec.get("ort"), (str, os.PathLike)):
                    raise _Unusable(f"it returned {spec!r}; expected a dict {{'ort': path, 'namespace': ns, "
                                    "'torch': path or None}")
                found.append(register_library(spec["ort"], namespace=spec.get("namespace"),
                                              torch_path=spec.get("torch")))
            except Exception as e:  # noqa: BLE001  (reported by name, never fatal)
                reason = str(e) if isinstance(e, _Unusable) else f"{type(e).__name__}: {e}"
                if torch_hidden and isinstance(e, ImportError) and (e.name or "").split(".")[0] == "torch":
                    reason = ("it imports torch, which opbridge hides while it loads these entry points: the "
                              "module an entry point names (and its package's __init__) must import neither "
                              "torch nor the package's torch side, as the <package>._library module of an "
                              f"`opbridge new-op` project does ({reason})")
                skipped.append(SkippedEntryPoint(ep.name, ep.value, package, reason))
    return found, skipped


def discover() -> list[OpLibrary]:
    """Registers the libraries installed packages announce: entry points of group
    ``opbridge.libraries`` naming a callable that returns ``{"ort": path, "namespace": ns,
    "torch": path or None}`` (the packages ``opbridge new-op`` makes do). Imports no torch: in a
    process that has not imported torch, the entry points are loaded with torch hidden. An entry
    point that fails (import, call, library), or takes over OPBRIDGE_DISCOVER_TIMEOUT seconds
    (default 5) is skipped with a RuntimeWarning naming its package. Returns the libraries found."""
    found, skipped = _discover()
    for s in skipped:
        warnings.warn(f"opbridge: skipped the op library of {s}", RuntimeWarning, stacklevel=2)
    return found
