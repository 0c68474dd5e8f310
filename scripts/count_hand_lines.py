"""Counts the lines written by hand in a project made by `opbridge new-op`: non-blank,
non-comment lines of the project that are not in what new-op generated (added or changed
lines, per file, by difflib), tests left out.

    python scripts/count_hand_lines.py PROJECT OP [--namespace NS] [--domain DOMAIN]

regenerates the scaffold in a temporary folder with the same arguments and compares."""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from pathlib import Path


def code_lines(text: str, suffix: str) -> list[str]:
    comment = "#" if suffix in (".py", ".toml", ".txt", "") else "//"
    out = []
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith(comment) or (suffix == ".py" and s.startswith(('"""', "'''"))):
            continue
        out.append(s)
    return out


def main() -> int:
    from opbridge._newop import new_op

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("project", type=Path)
    p.add_argument("op")
    p.add_argument("--namespace")
    p.add_argument("--domain")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scaffold = new_op(args.op, dir=Path(tmp) / args.project.name, namespace=args.namespace, domain=args.domain).dir
        total = 0
        for f in sorted(args.project.rglob("*")):
            rel = f.relative_to(args.project)
            if not f.is_file() or rel.parts[0] in ("tests", "build") or "__pycache__" in rel.parts:
                continue
            mine = code_lines(f.read_text(), f.suffix)
            base_file = scaffold / rel
            base = code_lines(base_file.read_text(), f.suffix) if base_file.exists() else []
            added = [l[2:] for l in difflib.ndiff(base, mine) if l.startswith("+ ")]
            if added:
                print(f"{rel}: {len(added)}")
                total += len(added)
        print(f"total: {total} hand-written lines (non-blank, non-comment, tests excluded)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
