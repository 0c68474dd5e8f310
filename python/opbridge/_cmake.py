"""Where opbridge's CMake package is installed (``find_package(opbridge CONFIG)``).

scikit-build-core finds it without help: the ``cmake.prefix`` entry point puts opbridge's package
folder on ``CMAKE_PREFIX_PATH``, where CMake finds ``share/cmake/opbridge/opbridgeConfig.cmake``.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

_CONFIG = "opbridgeConfig.cmake"


def cmake_dir() -> str:
    """Folder holding ``opbridgeConfig.cmake``: pass it to CMake as ``-Dopbridge_DIR=<dir>``
    (or its grandparent's parent, opbridge's package folder, on ``CMAKE_PREFIX_PATH``)."""
    # importlib.resources also sees the files of an editable install, which live outside the
    # package directory.
    candidates = []
    try:
        candidates.append(Path(str(importlib.resources.files("opbridge") / "share" / "cmake" / "opbridge")))
    except (FileNotFoundError, TypeError):
        pass
    candidates.append(Path(__file__).resolve().parent / "share" / "cmake" / "opbridge")
    for d in candidates:
        if (d / _CONFIG).is_file():
            return str(d.resolve())
    raise FileNotFoundError(
        f"opbridge: {_CONFIG} is not installed under {candidates[-1]}; reinstall opbridge "
        "(pip install --no-build-isolation .)"
    )
