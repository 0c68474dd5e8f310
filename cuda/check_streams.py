#!/usr/bin/env python3
"""Fails when CUDA code under the given folders could run on the default stream.

opbridge's CUDA work must run on the stream the framework hands over (torch's current stream,
ORT's compute stream): work on the default stream is unordered with respect to it. The launch
helper's Stream type (cuda/common/launch.cuh) makes a literal null stream a compile error; this
check covers what the type system cannot see:

* ``kernel<<<grid, block[, smem]>>>`` without a stream, or with a null one;
* cudaLaunchKernel* / cuLaunchKernel* called anywhere but the launch helper itself;
* synchronous runtime calls that use the default stream or synchronize the whole device
  (cudaMemcpy, cudaMemset, cudaDeviceSynchronize, cudaMalloc, cudaFree, ...);
* stream-taking runtime calls (cudaMemcpyAsync, cudaEventRecord, ...) whose stream argument is
  omitted (C++ defaults it to 0) or is a null / legacy / per-thread default-stream literal;
* opbridge launchers (``launch_<op>(stream, ...)``) called with a null stream literal.

Usage: check_streams.py [--depfile FILE --target STAMP] PATH... (folders are searched for
.cu/.cuh/.cpp/.h/.hpp files; the build passes cuda/common and each op's folder, and a depfile
that lists the files read).
Exit status 0 when clean, 1 with one ``file:line: message`` per finding otherwise.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

SUFFIXES = {".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp"}
# The one file allowed to call the raw launch APIs (it wraps them behind the Stream type).
LAUNCH_HELPER = "launch.cuh"

RAW_LAUNCH = re.compile(r"\b(cudaLaunchKernel\w*|cudaLaunchCooperativeKernel\w*|cuLaunch\w*)\s*\(")
SYNC_CALLS = re.compile(
    r"\b(cudaMemcpy|cudaMemcpy2D|cudaMemcpy3D|cudaMemcpyToSymbol|cudaMemcpyFromSymbol|cudaMemcpyPeer|"
    r"cudaMemset|cudaMemset2D|cudaMemset3D|cudaDeviceSynchronize|cudaThreadSynchronize|cudaMalloc|"
    r"cudaMallocPitch|cudaMallocManaged|cudaFree)\s*\("
)
# Runtime calls that take a stream, and the (0-based) position of that argument.
STREAM_ARG = {
    "cudaMemcpyAsync": 4,
    "cudaMemcpy2DAsync": 7,
    "cudaMemcpy3DAsync": 1,
    "cudaMemcpyToSymbolAsync": 5,
    "cudaMemcpyFromSymbolAsync": 5,
    "cudaMemcpyPeerAsync": 5,
    "cudaMemsetAsync": 3,
    "cudaMemset2DAsync": 5,
    "cudaMemset3DAsync": 3,
    "cudaMallocAsync": 2,
    "cudaMallocFromPoolAsync": 3,
    "cudaFreeAsync": 1,
    "cudaEventRecord": 1,
    "cudaEventRecordWithFlags": 1,
    "cudaStreamWaitEvent": 0,
    "cudaStreamSynchronize": 0,
    "cudaStreamQuery": 0,
    "cudaLaunchHostFunc": 0,
    "cudaStreamAddCallback": 0,
}
STREAM_CALL = re.compile(r"\b(" + "|".join(STREAM_ARG) + r")\s*\(")
OPBRIDGE_LAUNCHER = re.compile(r"\b(launch_\w+)\s*(?:<[^;(){}]*>)?\s*\(")
NULL_STREAM = re.compile(
    r"^\(*\s*(?:0[uUlL]*|nullptr|NULL|cudaStreamLegacy|cudaStreamPerThread|CU_STREAM_LEGACY|CU_STREAM_PER_THREAD|"
    r"\(\s*cudaStream_t\s*\)\s*(?:0[uUlL]*|nullptr|NULL)|"
    r"(?:static_cast|reinterpret_cast)\s*<\s*cudaStream_t\s*>\s*\(\s*(?:0[uUlL]*|nullptr|NULL)\s*\)|"
    r"cudaStream_t\s*[({]\s*(?:0[uUlL]*|nullptr|NULL)?\s*[)}]|\{\s*\})\s*\)*$"
)


def strip_code(text: str) -> str:
    """Blanks comments and string/char literals (keeping newlines, so line numbers still hold)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * max(0, j - i - 2) + (c if j - i >= 2 else ""))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def split_args(text: str, start: int, close: str) -> tuple[list[str], int] | None:
    """Splits the arguments that begin at text[start] up to the matching `close` (")" or ">>>")
    at top level. Commas inside (), [], {} and template argument lists (a `<` right after a name)
    do not split. Returns (args, index after the close) or None when unbalanced."""
    args, depth, angle, cur = [], 0, 0, []
    i, n = start, len(text)
    while i < n:
        if depth == 0 and angle == 0 and text.startswith(close, i):
            args.append("".join(cur).strip())
            return ([] if args == [""] else args), i + len(close)
        c = text[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth < 0:
                return None
        elif c == "<" and i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_") and not text.startswith("<<", i):
            angle += 1
        elif c == ">" and angle > 0 and not text.startswith(">>>", i):
            angle -= 1
        elif c == "," and depth == 0 and angle == 0:
            args.append("".join(cur).strip())
            cur = []
            i += 1
            continue
        cur.append(c)
        i += 1
    return None


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def check_text(name: str, raw: str) -> list[str]:
    text = strip_code(raw)
    problems = []

    def report(pos: int, msg: str) -> None:
        problems.append(f"{name}:{line_of(text, pos)}: {msg}")

    for m in re.finditer(r"<<<", text):
        parsed = split_args(text, m.end(), ">>>")
        if parsed is None:
            report(m.start(), "unbalanced <<<...>>> launch configuration")
            continue
        args, _ = parsed
        if len(args) < 4:
            report(m.start(), f"kernel launch <<<{', '.join(args)}>>> has no stream argument "
                              "(it would run on the default stream); launch through opbridge::cuda::launch")
        elif NULL_STREAM.match(args[3]):
            report(m.start(), f"kernel launch on the default stream ({args[3]})")
    if Path(name).name != LAUNCH_HELPER:
        for m in RAW_LAUNCH.finditer(text):
            report(m.start(), f"{m.group(1)} called directly; launch through opbridge::cuda::launch "
                              "(cuda/common/launch.cuh), which requires an explicit stream")
    for m in SYNC_CALLS.finditer(text):
        report(m.start(), f"{m.group(1)} runs on the default stream or synchronizes the device; use the "
                          "stream-ordered ...Async form on the caller's stream or the framework's allocator")
    for m in STREAM_CALL.finditer(text):
        parsed = split_args(text, m.end(), ")")
        if parsed is None:
            continue
        args, _ = parsed
        pos = STREAM_ARG[m.group(1)]
        if len(args) <= pos:
            report(m.start(), f"{m.group(1)} without its stream argument (C++ defaults it to the default stream)")
        elif NULL_STREAM.match(args[pos]):
            report(m.start(), f"{m.group(1)} on the default stream ({args[pos]})")
    for m in OPBRIDGE_LAUNCHER.finditer(text):
        parsed = split_args(text, m.end(), ")")
        if parsed is None or not parsed[0]:
            continue
        if NULL_STREAM.match(parsed[0][0]):
            report(m.start(), f"{m.group(1)} called with the default stream ({parsed[0][0]})")
    return sorted(problems, key=lambda p: int(p[len(name) + 1:].split(":", 1)[0]))


def iter_files(paths: list[str]):
    for p in map(Path, paths):
        if p.is_dir():
            yield from sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in SUFFIXES)
        elif p.is_file():
            yield p


def write_depfile(path: str, target: str, files: list[Path]) -> None:
    """A Makefile-style depfile: `target` depends on every file read, so the build re-runs the
    check when one of them changes."""
    def esc(p: object) -> str:
        return str(Path(p).resolve()).replace("\\", "\\\\").replace(" ", "\\ ").replace("#", "\\#").replace("$", "$$")

    Path(path).write_text(f"{esc(target)}: " + " \\\n  ".join(esc(f) for f in files) + "\n")


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("paths", nargs="*", metavar="PATH", help="folders (searched) or files to check")
    parser.add_argument("--depfile", help="write a Makefile-style depfile listing the files checked")
    parser.add_argument("--target", help="the depfile's target (the build's stamp file)")
    args = parser.parse_args(argv)
    if not args.paths:
        parser.print_usage(sys.stderr)
        return 2
    if args.depfile and not args.target:
        parser.error("--depfile needs --target")
    problems = []
    files = list(iter_files(args.paths))
    for f in files:
        problems += check_text(str(f), f.read_text(encoding="utf-8", errors="replace"))
    if args.depfile:
        write_depfile(args.depfile, args.target, files)
    for p in problems:
        print(p)
    if problems:
        print(f"check_streams: {len(problems)} default-stream problem(s) in {len(files)} file(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
