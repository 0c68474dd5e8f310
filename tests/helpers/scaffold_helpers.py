"""Build and test projects of users' own ops (made by `opbridge new-op`, or examples/) the way a
user does: `pip install --no-build-isolation` (into a private --target folder, so that the test
environment is left as it was), then the project's own tests in a subprocess that sees it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers.cmake_helpers import TIMEOUT_S, require_toolchain


def pip_install(project: Path, target: Path, build_dir: Path, *config: str) -> None:
    """pip install --no-build-isolation PROJECT into TARGET (no dependencies: they are here)."""
    require_toolchain()
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--no-index",
           "--target", str(target), f"-Cbuild-dir={build_dir}", *config, str(project)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S,
                       env={**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2")})
    if p.returncode != 0:
        pytest.fail(f"pip install {project} failed ({p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}")


def env_with(target: Path) -> dict:
    """The environment of a subprocess that imports what pip installed into `target`."""
    path = os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path}


def run_python(args: list, target: Path, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, *[str(a) for a in args]], capture_output=True, text=True, cwd=cwd,
                       env=env_with(target), timeout=TIMEOUT_S)
    if check and p.returncode != 0:
        pytest.fail(f"python {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stdout[-8000:]}\n{p.stderr[-4000:]}")
    return p


def run_readme_block(project: Path, target: Path, workdir: Path, check: str = "") -> str:
    """The one ```python block of the project's README.md, as a user copies it, followed by
    ``check`` (code that reads the block's names), run in ``workdir``; returns its stdout. With a
    check, the check must print "same result"."""
    (block,) = re.findall(r"^```python\n(.*?)^```", (project / "README.md").read_text(), flags=re.S | re.M)
    script = workdir / "readme.py"
    script.write_text(block + check)
    out = run_python([script], target, workdir)
    if check:
        assert "same result" in out.stdout, out.stdout + out.stderr
    return out.stdout


def run_project_tests(project: Path, target: Path) -> str:
    """The project's own tests, as generated or written: they must pass."""
    p = run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], target, project)
    return p.stdout


def fake_op_package(site: Path, name: str, code: str, entry_point: str | None = None) -> None:
    """A pure-Python distribution NAME in SITE (a folder to put on PYTHONPATH), laid out as pip
    installs one: package NAME whose __init__.py is CODE, and the `opbridge.libraries` entry point
    NAME = ENTRY_POINT (default NAME:library_spec)."""
    package = site / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(code))
    info = site / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[opbridge.libraries]\n{name} = {entry_point or name + ':library_spec'}\n")
