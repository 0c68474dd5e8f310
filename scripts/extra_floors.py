"""Prints the requirements of extras of pyproject.toml with each floor made exact ("onnx>=1.23" ->
"onnx==1.23"): the oldest releases opbridge declares it supports, which the version matrices
install (scripts/ort_matrix.sh, scripts/torch_matrix.sh). References to opbridge's own extras
("opbridge[tools]") are followed; a package with several floors gets the highest.

    python scripts/extra_floors.py EXTRA [EXTRA ...] [--skip NAME ...]
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version


def floors(extras: list[str], skip: set[str]) -> list[str]:
    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    table = project["optional-dependencies"]
    found: dict[str, Version] = {}
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        if extra not in table:
            sys.exit(f"extra_floors.py: pyproject.toml has no extra {extra!r} (has: {', '.join(table)})")
        seen.add(extra)
        for line in table[extra]:
            req = Requirement(line)
            if req.name == project["name"]:
                todo += sorted(req.extras)
                continue
            if req.name in skip:
                continue
            lows = [Version(s.version) for s in req.specifier if s.operator == ">="]
            if not lows:
                sys.exit(f"extra_floors.py: {line!r} (extra {extra!r}) has no >= floor")
            found[req.name] = max([*lows, found.get(req.name, lows[0])])
    return [f"{name}=={version}" for name, version in sorted(found.items())]


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("extras", nargs="+")
    p.add_argument("--skip", action="append", default=[], metavar="NAME", help="leave this package out")
    args = p.parse_args()
    print(" ".join(floors(args.extras, set(args.skip))))
