"""Docs that run: every fenced code block of README.md and docs/*.md is marked (docs/README.md,
"Code blocks") and checked as its marker says. Complete blocks run as written, the blocks of a
page in page order in one temporary directory, each in a fresh process: `run` ones here, `run slow`
ones in the slow suite (--run-slow), `run gpu` ones in the GPU suite (cuda marker); excerpts match
the file they name; commands that cannot run name only scripts, modules, options and CMake
variables that exist. Also: every `opbridge.…` the docs name in backticks resolves and every
import statement they quote runs. Files the docs name: tests/docs/test_docs_files.py; figures and
messages they quote: tests/docs/test_docs_claims.py."""

from __future__ import annotations

import ast
import functools
import glob
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.docs_blocks import DOCS, KINDS, REPO, RUN_SUITES, SHELL, Block, all_blocks, code_spans, commands
from helpers.docs_blocks import missing_excerpt_lines

BLOCKS = all_blocks()
RUN_LANGS = ("python", *SHELL)
BLOCK_TIMEOUT_S = 900


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


# ---- every block is marked ----------------------------------------------------------------------

def test_every_block_is_marked():
    problems = []
    for b in BLOCKS:
        if b.marker is None:
            problems.append(f"{b.where}: no marker on the line before the fence (docs/README.md, 'Code blocks')")
        elif b.kind not in KINDS:
            problems.append(f"{b.where}: unknown marker kind {b.kind!r} (one of {', '.join(KINDS)})")
        elif b.kind == "run":
            if b.lang not in RUN_LANGS:
                problems.append(f"{b.where}: a `run` block must be ```python, ```sh or ```bash, not {b.lang!r}")
            if len(b.args) > 1 or (b.args and b.args[0] not in RUN_SUITES):
                problems.append(f"{b.where}: `run` takes at most one of {', '.join(RUN_SUITES)}, got {b.args}")
        elif b.kind == "excerpt":
            if len(b.args) != 1 or not b.excerpt_of.is_file():
                problems.append(f"{b.where}: `excerpt` names one repository file that exists, got {b.args}")
            elif not _names_file(b):
                problems.append(f"{b.where}: the text before an excerpt (or its first line) names its file "
                                f"{b.args[0]} (visible to readers, not only in the marker)")
        elif b.kind == "not-run" and not b.args[0].strip():
            problems.append(f"{b.where}: `not-run` states why (e.g. 'not-run: hours long')")
    assert not problems, "\n".join(problems)


def _names_file(b: Block) -> bool:
    path = b.args[0]
    last_paragraph = b.before.rstrip().split("\n\n")[-1]
    first_line = b.text.splitlines()[0] if b.text.strip() else ""
    return any(path in t or Path(path).name in t for t in (last_paragraph, first_line))


def test_marker_parsing_finds_every_fence(tmp_path):
    """The parser itself: markers, languages, fences of other lengths, text before a block."""
    page = tmp_path / "page.md"
    page.write_text("# T\n\nSee `a.py`:\n\n<!-- docs: excerpt a.py -->\n```python\nx = 1\n```\n\n"
                    "````\n```\nnested\n```\n````\n<!-- docs: not-run: needs a server -->\n```sh\nls\n```\n")
    from helpers.docs_blocks import blocks

    got = blocks(page)
    assert [(b.line, b.lang, b.kind, b.args) for b in got] == [
        (6, "python", "excerpt", ["a.py"]), (10, "", "", []), (16, "sh", "not-run", ["needs a server"])]
    assert got[0].text == "x = 1\n" and "See `a.py`" in got[0].before
    assert got[1].text == "```\nnested\n```\n"


# ---- excerpts ----------------------------------------------------------------------------------

EXCERPTS = [b for b in BLOCKS if b.kind == "excerpt" and b.excerpt_of and b.excerpt_of.is_file()]


@pytest.mark.parametrize("block", EXCERPTS, ids=[b.where for b in EXCERPTS])
def test_excerpt_matches_its_file(block):
    missing = missing_excerpt_lines(block)
    assert not missing, (f"{block.where}: lines of the excerpt not found, in order, in {block.args[0]} "
                         "(comments and whitespace aside):\n" + "\n".join(missing))


def test_excerpt_check_can_fail(tmp_path):
    f = tmp_path / "f.cpp"
    f.write_text("int a = 1;  // one\nint b = 2;\nint c = 3;\n")
    b = Block(f, 1, "cpp", "int a = 1;\n// a comment\nint c = 3;  // three\n", "", "", "excerpt", [str(f)])
    assert missing_excerpt_lines(b) == []
    b.text = "int c = 3;\nint a = 1;\n"  # out of order
    assert missing_excerpt_lines(b) == ["int a = 1;"]


# ---- running the complete blocks -----------------------------------------------------------------

def _pages(suite: str) -> list:
    """Pages with `run` blocks of this suite ("" for the test suite), as pytest params."""
    out = []
    for path in DOCS:
        page = [b for b in BLOCKS if b.path == path and b.kind == "run"]
        if any(b.suite == suite for b in page):
            marks = {"slow": [pytest.mark.slow], "gpu": [pytest.mark.cuda, pytest.mark.torch]}.get(suite, [])
            out.append(pytest.param(path, id=_rel(path), marks=marks))
    return out


def _block_env(tmp: Path) -> dict:
    """What a block runs with: this venv's programs first on PATH; `pip install` goes to a private
    folder on PYTHONPATH, never into the environment; nothing is downloaded."""
    site = tmp / "_site"
    site.mkdir(exist_ok=True)
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    env.update(PIP_TARGET=str(site), PIP_NO_DEPS="1", PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg",
               CMAKE_BUILD_PARALLEL_LEVEL=env.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"))
    env.pop("VIRTUAL_ENV", None)
    return env


def run_page(path: Path, suite: str, tmp: Path) -> None:
    """The page's `run` blocks of the test suite and, for "slow" / "gpu", those of that suite too,
    in page order, in one temporary directory, each in a fresh process."""
    env = _block_env(tmp)
    for b in [b for b in BLOCKS if b.path == path and b.kind == "run" and b.suite in ("", suite)]:
        script = tmp / f"_block_{b.line}.{'py' if b.lang == 'python' else 'sh'}"
        script.write_text(b.text)
        cmd = [sys.executable, str(script)] if b.lang == "python" else ["bash", "-euo", "pipefail", str(script)]
        r = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
        assert r.returncode == 0, (f"{b.where} failed (exit status {r.returncode}):\n{b.text}\n--- stdout\n"
                                   f"{r.stdout[-4000:]}\n--- stderr\n{r.stderr[-6000:]}")


@pytest.mark.parametrize("path", _pages(""))
def test_blocks_run(path, tmp_path):
    pytest.importorskip("torch", reason="the docs' examples use torch")
    run_page(path, "", tmp_path)


@pytest.mark.parametrize("path", _pages("slow"))
def test_blocks_run_slow(path, tmp_path):
    pytest.importorskip("torch", reason="the docs' examples use torch")
    run_page(path, "slow", tmp_path)


@pytest.mark.parametrize("path", _pages("gpu"))
def test_blocks_run_gpu(path, tmp_path):
    run_page(path, "gpu", tmp_path)


def test_a_failing_block_fails(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("<!-- docs: run -->\n```python\nraise SystemExit('wrong')\n```\n")
    from helpers.docs_blocks import blocks

    monkeypatch.setattr(sys.modules[__name__], "BLOCKS", blocks(page))
    with pytest.raises(AssertionError, match=r"page.md:2 failed \(exit status 1\)"):
        run_page(page, "", tmp_path)


def test_ci_blocks_are_what_ci_runs():
    """`run ci` blocks: README's Quick start is what .ci/quickstart.py hands .ci/run; any other
    `run ci` command is one of .ci/run's."""
    ci = (REPO / ".ci" / "run").read_text()
    quick = subprocess.run([sys.executable, str(REPO / ".ci" / "quickstart.py")], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    found = [b for b in BLOCKS if b.kind == "run" and b.suite == "ci"]
    readme = [b for b in found if b.path.name == "README.md"]
    assert [" && ".join(line.strip() for line in b.text.strip().splitlines()) for b in readme] == quick
    for b in found:
        if b.path.name == "README.md":
            continue
        for line in b.text.splitlines():
            cmd = line.split("#")[0].strip()
            assert cmd in ci, f"{b.where}: `{cmd}` is marked `run ci` but .ci/run does not run it"


# ---- what blocks and prose name ------------------------------------------------------------------

SOURCE_SUFFIXES = (".py", ".sh", ".cmake", ".txt")


def _cmake_variables() -> str:
    return "\n".join(p.read_text() for p in [REPO / "CMakeLists.txt", *sorted((REPO / "cmake").glob("*"))]
                     if p.is_file())


def _benchmark_names() -> set[str]:
    """The names `asv -b REGEX` is searched in: module.Class.method and module.function."""
    names = set()
    for f in (REPO / "benchmarks" / "benchmarks").glob("*.py"):
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, ast.ClassDef):
                names |= {f"{f.stem}.{node.name}.{m.name}" for m in node.body if isinstance(m, ast.FunctionDef)}
            elif isinstance(node, ast.FunctionDef):
                names.add(f"{f.stem}.{node.name}")
    return names


def _module_source(name: str, base: Path) -> str | None:
    """The source text of module `name` as `python -m` finds it, run from `base` (or from the
    repository root, or benchmarks/ as docs/benchmarks.md says); "" for an installed third-party
    module (its options are not checked); None where there is no such module."""
    if name == "opbridge":
        return _cli_source()
    if name == "pytest":
        return _pytest_help()
    in_repo = False
    for root in (base, REPO, REPO / "benchmarks"):
        if root.joinpath(name.split(".")[0]).is_dir():  # a package of the repository
            in_repo = True
            f = root.joinpath(*name.split("."))
            for cand in (f.with_suffix(".py"), f / "__main__.py"):
                if cand.is_file():
                    return cand.read_text()
    if in_repo:
        return None
    try:
        spec = importlib.util.find_spec(name)
    except ImportError:
        spec = None
    return "" if spec is not None else None


@functools.lru_cache(maxsize=None)
def _pytest_help() -> str:
    """pytest's options, with those of tests/conftest.py."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    return r.stdout


def _cli_source() -> str:
    return "\n".join(p.read_text() for p in (REPO / "python" / "opbridge").glob("*.py"))


def command_problems(words: list[str], base: Path) -> list[str]:
    """What a command names that does not exist: its script or module, its options (--x) in the
    program's source, `-Ccmake.define.X` / `-DX` in CMake files, `asv -b X` among the benchmarks,
    repository paths among its arguments."""
    prog, args = words[0], words[1:]
    source = None
    problems = []
    if prog in ("python", "python3") and args:
        if args[0] == "-m" and len(args) > 1:
            source = _module_source(args[1], base)
            if source is None:
                problems.append(f"python -m {args[1]}: no such module")
            args = args[2:]
        elif args[0].endswith(".py"):
            f = base / args[0]
            if not f.is_file():
                problems.append(f"{args[0]}: no such file")
            else:
                source = f.read_text()
            args = args[1:]
        else:
            return []
    elif prog == "opbridge":
        source = _cli_source()
        if args and not args[0].startswith("-") and f'"{args[0]}"' not in source:
            problems.append(f"opbridge {args[0]}: no such subcommand in python/opbridge/cli.py")
    elif "/" in prog and not prog.startswith(("/", "$")):
        f = base / prog
        if not f.is_file():
            problems.append(f"{prog}: no such file")
        else:
            source = f.read_text()
    elif prog == "asv":
        names = _benchmark_names()
        for k, a in enumerate(args[:-1]):
            if a == "-b" and not any(re.search(args[k + 1], n) for n in names):
                problems.append(f"asv -b {args[k + 1]}: no benchmark of that name in benchmarks/benchmarks/")
        return problems
    elif prog == "cd" and args:
        if not (base / args[0]).is_dir():
            problems.append(f"cd {args[0]}: no such folder")
        return problems
    for a in args:
        if source and a.startswith("--") and len(a) > 2:
            opt = a.split("=")[0]
            if opt not in source:
                problems.append(f"{' '.join(words[:2])}: option {opt} appears nowhere in its source")
        m = re.match(r"-Ccmake\.define\.([A-Za-z0-9_]+)=", a)
        if m and not m.group(1).startswith("CMAKE_") and m.group(1) not in _cmake_variables():
            problems.append(f"{a}: CMake variable {m.group(1)} appears nowhere in CMakeLists.txt or cmake/")
        if re.match(r"^(tests|scripts|examples|benchmarks|docs|cpp|cuda|python|cmake)/", a):
            pattern = re.sub(r"<[^>]+>", "*", a)
            if not glob.glob(str(base / pattern)):
                problems.append(f"{a}: no such path")
    if prog == "cmake" and "-S" in args:
        src = base / args[args.index("-S") + 1]
        for a in args:
            m = re.match(r"-D([A-Za-z0-9_]+)=", a)
            if m and not m.group(1).endswith("_DIR") and not m.group(1).startswith("CMAKE_") \
                    and src.joinpath("CMakeLists.txt").is_file() \
                    and m.group(1) not in src.joinpath("CMakeLists.txt").read_text():
                problems.append(f"{a}: {m.group(1)} appears nowhere in {_rel(src / 'CMakeLists.txt')}")
    return problems


SHELL_BLOCKS = [b for b in BLOCKS if b.lang in SHELL and b.kind in ("run", "not-run")]


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=[b.where for b in SHELL_BLOCKS])
def test_commands_name_what_exists(block):
    base = REPO
    problems = []
    for words in commands(block.text):
        problems += command_problems(words, base)
        if words[0] == "cd" and len(words) > 1 and (base / words[1]).is_dir():
            base = base / words[1]
    assert not problems, f"{block.where}:\n" + "\n".join(problems)


def test_inline_commands_name_what_exists():
    """Commands quoted in backticks in the prose (`opbridge check --stock`, `scripts/x.sh --y`, ...)."""
    problems, n = [], 0
    for path in DOCS:
        for line, span in code_spans(path):
            if not re.match(r"(opbridge [a-z]|python3? (-m \w|\S+\.py)|scripts/|pip install |cmake -S )", span):
                continue
            n += 1
            for words in commands(span):
                problems += [f"{_rel(path)}:{line}: `{span}`: {p}" for p in command_problems(words, REPO)]
    assert n > 10
    assert not problems, "\n".join(problems)


def test_command_check_can_fail():
    assert command_problems(["scripts/no_such_script.sh"], REPO) == ["scripts/no_such_script.sh: no such file"]
    assert command_problems(["scripts/sanitize.sh", "--no-such-option"], REPO)
    assert command_problems(["opbridge", "optimize", "--no-such-option"], REPO)
    assert command_problems(["pip", "install", "-Ccmake.define.OPBRIDGE_NO_SUCH=1", "."], REPO)
    assert command_problems(["asv", "run", "-b", "NoSuchBenchmark"], REPO)
    assert command_problems(["asv", "run", "-b", "^no_such_module"], REPO)
    assert not command_problems(["asv", "run", "-b", "^bench_inverse.InverseSpeedup"], REPO)
    assert command_problems(["python", "-m", "tests.fuzz.no_such_module"], REPO)
    assert not command_problems(["opbridge", "optimize", "--no-silu"], REPO)


# Names in backticks that are not Python objects.
NOT_SYMBOLS = {"opbridge.libraries": "the entry point group of users' op packages"}


def _symbols() -> list[tuple[str, str]]:
    out = []
    for path in DOCS:
        for line, span in code_spans(path):
            for m in re.finditer(r"(?<![\w.:/-])opbridge(?:\.[A-Za-z_]\w*)+", span):
                if m.group(0) not in NOT_SYMBOLS:
                    out.append((f"{_rel(path)}:{line}", m.group(0)))
    return out


def resolve(dotted: str):
    """What `dotted` is after `import <its longest importable prefix>`, as a user would write it."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        try:
            importlib.import_module(".".join(parts[:k]))
            break
        except ImportError:
            continue
    obj = importlib.import_module(parts[0])
    for p in parts[1:]:
        obj = getattr(obj, p)
    return obj


def test_opbridge_names_resolve():
    pytest.importorskip("torch", reason="the docs name the torch side too")
    found = _symbols()
    assert len(found) > 50  # the parser found the docs' names
    bad = []
    for where, name in found:
        try:
            resolve(name)
        except (AttributeError, ImportError) as e:
            bad.append(f"{where}: `{name}`: {type(e).__name__}: {e}")
    assert not bad, "\n".join(bad)


IMPORT_SPAN = re.compile(r"(from opbridge(?:\.\w+)* import \w+(?:, \w+)*|import opbridge(?:\.\w+)*)")


def test_import_statements_run():
    """Every `import opbridge...` / `from opbridge... import name` the docs quote in backticks
    runs, each in a fresh process (the name a `from` import gives is then used: a function such
    as docs/group_norm.md's `uses_channels_last` is called on a channels-last tensor)."""
    pytest.importorskip("torch", reason="the docs import the torch side too")
    found = sorted({span for path in DOCS for _, span in code_spans(path) if IMPORT_SPAN.fullmatch(span)})
    assert "from opbridge.ops.group_norm import uses_channels_last" in found and len(found) >= 4
    bad = []
    for stmt in found:
        r = subprocess.run([sys.executable, "-c", stmt], capture_output=True, text=True, timeout=300)
        if r.returncode:
            bad.append(f"`{stmt}`: {r.stderr.strip().splitlines()[-1]}")
    assert not bad, "\n".join(bad)
    check = ("import torch\nfrom opbridge.ops.group_norm import uses_channels_last\n"
             "x = torch.randn(2, 8, 3, 5)\n"
             "print(uses_channels_last(x), uses_channels_last(x.contiguous(memory_format=torch.channels_last)))\n")
    r = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300)
    assert r.stdout.split() == ["False", "True"], r.stdout + r.stderr


def test_resolve_fails_where_a_function_shadows_a_module():
    pytest.importorskip("torch")
    # opbridge.ops.group_norm is the function, which shadows the module of that name.
    assert callable(resolve("opbridge.ops.group_norm"))
    with pytest.raises(AttributeError):
        resolve("opbridge.ops.group_norm.uses_channels_last")
