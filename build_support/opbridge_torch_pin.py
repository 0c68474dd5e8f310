"""Build-time metadata: pins the torch release opbridge's torch extension is compiled against.

A scikit-build-core dynamic-metadata provider ([[tool.dynamic-metadata]] in pyproject.toml). The
torch extension only loads into the torch release it was built for (torch has no stable C++ ABI),
so the wheel's torch extras require exactly that release: ``torch==2.13.0`` for a build against
torch 2.13.0+cpu. The local label (+cpu, +cu130) is left out: every build of one release has the
same C++ API, and an index has only one of them under a given name. opbridge checks the same
version when it loads the extension (opbridge._library.check_torch_version).

The torch is the one the build's Python imports, as for CMake (cmake/opbridge_torch.cmake): with
``pip install --no-build-isolation`` the environment's torch. Without torch there (an ORT-only
build, OPBRIDGE_WITH_TORCH=OFF) the extras require plain ``torch``.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any, Mapping


def _torch_requirement() -> str:
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "torch"
    return f"torch=={version.split('+', 1)[0]}"


def dynamic_metadata(settings: Mapping[str, Any], project: Mapping[str, Any]) -> dict[str, Any]:
    extras = settings.get("extras")
    if not isinstance(extras, list) or not all(isinstance(e, str) for e in extras) or not extras:
        raise ValueError("opbridge_torch_pin: set `extras` to the list of extras that need torch")
    requirement = _torch_requirement()
    return {"optional-dependencies": {extra: [requirement] for extra in extras}}


def dynamic_wheel(settings: Mapping[str, Any]) -> dict[str, bool]:
    # A wheel built from the sdist pins whatever torch its build environment has.
    return {"optional-dependencies": True}
