"""Counts the lines written by hand in a project made by `opbridge new-op`: non-blank,
non-comment lines of the project that are not in what new-op generated (added or changed
lines, per file, by difflib), tests left out.

    python scripts/count_hand_lines.py PROJECT OP [OP ...] [--namespace NS] [--domain DOMAIN] [--cuda] [--no-format]

regenerates the scaffold in a temporary folder with the same arguments and compares (several ops:
made in the order given, as `new-op OP --dir PROJECT` adds them; each op's own files, ops/OP/ and
python/*/ops/OP.py, are counted for it, the other files as shared). Both sides
are first formatted the same way where the formatters are installed (`ruff format` for Python,
`clang-format` for C++/CUDA; both on PyPI), so a line count cannot be changed by how lines are
wrapped; the report says which formatters ran. Skipped: tests/, build and dist folders, hidden
folders (.git, .venv, caches), __pycache__, *.egg-info, and files that are not UTF-8 text."""

from __future__ import annotations

import argparse
import difflib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CPP_SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
CLANG_STYLE = "{BasedOnStyle: Google, ColumnLimit: 120}"
SKIPPED_DIRS = ("tests", "build", "dist", "__pycache__")


def skipped(rel: Path) -> bool:
    dirs = rel.parts[:-1]
    return ((bool(rel.parts) and rel.parts[0] in SKIPPED_DIRS) or "__pycache__" in dirs
            or any(p.startswith(".") or p.endswith(".egg-info") for p in dirs))


def formatters() -> dict[str, list[str]]:
    """The formatter command (reading stdin, writing stdout) per kind of file, where installed."""
    found = {}
    ruff = shutil.which("ruff")
    if ruff:
        found["python"] = [ruff, "format", "--line-length", "120", "--stdin-filename", "x.py", "-"]
    clang = shutil.which("clang-format")
    if clang:
        found["cpp"] = [clang, f"--style={CLANG_STYLE}", "--assume-filename=x.cpp"]
    return found


def formatted(text: str, suffix: str, fmt: dict[str, list[str]]) -> str:
    kind = "python" if suffix == ".py" else "cpp" if suffix in CPP_SUFFIXES else None
    if kind not in fmt:
        return text
    r = subprocess.run(fmt[kind], input=text, capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else text  # unparsable: counted as written


def code_lines(text: str, suffix: str) -> list[str]:
    comment = "#" if suffix in (".py", ".toml", ".txt", "") else "//"
    out = []
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith(comment) or (suffix == ".py" and s.startswith(('"""', "'''"))):
            continue
        out.append(s)
    return out


def read_text(f: Path) -> str | None:
    try:
        return f.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None


def count(project: Path, scaffold: Path, fmt: dict[str, list[str]]) -> tuple[int, dict[str, int]]:
    per_file = {}
    for f in sorted(project.rglob("*")):
        rel = f.relative_to(project)
        if not f.is_file() or skipped(rel):
            continue
        text = read_text(f)
        if text is None:
            continue
        mine = code_lines(formatted(text, f.suffix, fmt), f.suffix)
        base_file = scaffold / rel
        base_text = read_text(base_file) if base_file.is_file() else None
        base = code_lines(formatted(base_text, f.suffix, fmt), f.suffix) if base_text is not None else []
        added = [line[2:] for line in difflib.ndiff(base, mine) if line.startswith("+ ")]
        if added:
            per_file[str(rel)] = len(added)
    return sum(per_file.values()), per_file


def owner(rel: str) -> str | None:
    """The op whose own file `rel` is (ops/OP/..., python/PKG/ops/OP.py), else None."""
    parts = Path(rel).parts
    if len(parts) >= 3 and parts[0] == "ops":
        return parts[1]
    if len(parts) == 4 and parts[0] == "python" and parts[2] == "ops" and parts[3] != "__init__.py":
        return Path(parts[3]).stem
    return None


def main(argv: list[str] | None = None) -> int:
    from opbridge._newop import new_op

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("project", type=Path)
    p.add_argument("ops", nargs="+", metavar="op")
    p.add_argument("--namespace")
    p.add_argument("--domain")
    p.add_argument("--cuda", action="store_true", help="the project was made with new-op --cuda")
    p.add_argument("--no-format", action="store_true", help="count the lines as written, unformatted")
    args = p.parse_args(argv)
    fmt = {} if args.no_format else formatters()
    with tempfile.TemporaryDirectory() as tmp:
        for op in args.ops:
            scaffold = new_op(op, dir=Path(tmp) / args.project.name, namespace=args.namespace, domain=args.domain,
                              cuda=args.cuda).dir
        total, per_file = count(args.project, scaffold, fmt)
    for rel, n in per_file.items():
        print(f"{rel}: {n}")
    if len(args.ops) > 1:
        for op in args.ops:
            print(f"op {op}: {sum(n for rel, n in per_file.items() if owner(rel) == op)}")
        print(f"shared: {sum(n for rel, n in per_file.items() if owner(rel) is None)}")
    how = ", ".join(f"{k} by {Path(v[0]).name}" for k, v in fmt.items()) or "none (ruff / clang-format not found)"
    print(f"total: {total} hand-written lines (non-blank, non-comment, tests excluded; formatted: {how})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
