"""Configure, build and install CMake projects from tests (the installed opbridge package's
consumers). Skips, with the reason, where there is no CMake or C++ compiler."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# A cold build of a consumer takes ~10-30 s on 2 cores; this only guards against a hang.
TIMEOUT_S = 900


def cmake_exe() -> str | None:
    try:  # the PyPI cmake (>= 3.26 here); the system one may be older
        import cmake

        return os.path.join(cmake.CMAKE_BIN_DIR, "cmake")
    except ImportError:
        return shutil.which("cmake")


def ninja_exe() -> str | None:
    try:
        import ninja

        return os.path.join(ninja.BIN_DIR, "ninja")
    except ImportError:
        return shutil.which("ninja")


def require_toolchain() -> str:
    """The cmake executable; skips the test where CMake or a C++ compiler is missing."""
    exe = cmake_exe()
    if exe is None or not os.path.exists(exe):
        pytest.skip("CMake is not installed (pip install cmake)")
    if not (os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        pytest.skip("no C++ compiler on PATH")
    return exe


def run(cmd: list, **kwargs) -> subprocess.CompletedProcess:
    """Runs cmd; on failure, fails the test with its output."""
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=TIMEOUT_S, **kwargs)
    if p.returncode != 0:
        pytest.fail(f"command failed ({p.returncode}): {' '.join(map(str, cmd))}\n"
                    f"--- stdout ---\n{p.stdout[-6000:]}\n--- stderr ---\n{p.stderr[-6000:]}")
    return p


def configure(src: Path, build: Path, defines: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """cmake -S src -B build with the test's Python and (when available) Ninja."""
    cmd = [require_toolchain(), "-S", src, "-B", build, f"-DPython_EXECUTABLE={sys.executable}",
           "-DCMAKE_BUILD_TYPE=Release"]
    ninja = ninja_exe()
    if ninja and os.path.exists(ninja):
        cmd += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    cmd += [f"-D{k}={v}" for k, v in (defines or {}).items()]
    if check:
        return run(cmd)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=TIMEOUT_S)


def build(build_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return run([require_toolchain(), "--build", build_dir, *extra])
