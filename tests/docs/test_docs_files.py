"""Every file the documentation names exists: the links of docs/*.md and README.md, and the paths
and file names they quote as code (``ops/group_norm/group_norm_decl.cpp``,
``torch_common.h``, the paths in a quoted command such as ``scripts/count_hand_lines.py
examples/rms_norm``), so that a renamed or deleted file cannot leave the docs pointing at nothing.

A quoted name is looked up as a path from the repository root, from the document's folder and
from the folders the docs quote headers and modules relative to (cpp/include for
``opbridge/op_decl.h``, python/ for ``opbridge/_decl.py``, ...), an op's header also by the path it
is installed at (``opbridge/group_norm.h`` is ``ops/group_norm/group_norm.h``); a bare file name must be the name
of a file in the repository. Names of files that are not ours (ONNX Runtime's headers, files a
build or a user's project makes) are listed below. A path with a placeholder or a glob
(``ops/<op>/<op>_decl.cpp``) must match some file; a bare file name with one
(``<op>_cuda_torch.cpp``) is a naming rule and is skipped.
"""

from __future__ import annotations

import glob
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]

# Folders the docs quote paths relative to, besides the root and the document's own.
BASES = ["cpp/include", "cpp", "cuda", "python", "python/opbridge", "tests", "benchmarks", "scripts", "cmake",
         "examples/rms_norm",  # a project as new-op makes it: the layout docs/cpp.md describes
         "examples"]
# File extensions that make a quoted word a file name.
EXTENSIONS = {".h", ".cuh", ".cpp", ".cu", ".inc", ".py", ".md", ".cmake", ".txt", ".toml", ".sh", ".json",
              ".map", ".in", ".tmpl", ".yml", ".cfg", ".pbtxt"}
# Files the docs may name that are not in this repository: third-party headers and libraries, and
# what a build, an install or a user's project makes.
NOT_OURS = {
    "onnxruntime_c_api.h", "onnxruntime_cxx_api.h", "onnxruntime_cxx_inline.h", "onnxruntime_float16.h",
    "onnxruntime_lite_custom_op.h", "cuda_context.h", "cuda_runtime.h", "cuda_runtime_api.h", "cuda_fp16.h",
    "cuda_bf16.h", "cooperative_groups.h", "extension.h", "library.h", "Tensor.h", "ops.h", "tensor.h",
    "accelerator.h", "ScalarType.h", "opbridgeConfig.cmake", "opbridgeConfigVersion.cmake", "_version.py",
    "config.pbtxt", "model.onnx", "model.onnx.data", "setup.py", "conanfile.txt", "conan_toolchain.cmake",
    "compile_commands.json", "asv-results.json", "requirements.txt", "test_op.py", "__init__.py", "out.json",
}
# Repository paths the docs name that a program of the repository writes.
MADE = {"docs/benchmarks.png"}  # benchmarks/plot.py


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        return out.splitlines()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: the files on disk
        return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]


TRACKED = _tracked()
BASENAMES = {Path(p).name for p in TRACKED}
# A quoted word with a slash that starts with one of these is a repository path, extension or not.
TOP_FOLDERS = {p.split("/")[0] for p in TRACKED if "/" in p}


def _references(text: str) -> list[tuple[str, str]]:
    """(kind, name) of every file reference in a markdown text, fenced code blocks excluded."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    refs = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        refs.append(("link", target.split("#", 1)[0]))
    for span in re.findall(r"`([^`\n]+)`", text):
        # A span may be a command (`scripts/count_hand_lines.py examples/rms_norm rms_norm`): each word.
        for word in span.split():
            word = word.rstrip(",.;:)")
            # "path:42" and "path::name" point into a file.
            word = re.sub(r"(:\d+(-\d+)?|::\w+)$", "", word)
            if re.search(r"[{}$|=,()\[\]'\"]", word) or word.startswith(("-", "~", "/", "./", "../")) \
                    or (word.startswith(".") and word.split("/")[0] not in TOP_FOLDERS):  # `.dist-info/`, not `.ci/run`
                continue
            if re.search(r"[<>*]", word) and "/" not in word.rstrip("/"):
                continue  # a naming rule (`<op>_cuda_torch.cpp`), not a file
            if Path(word).suffix in EXTENSIONS or (word.endswith("/") and "/" in word[:-1]) \
                    or word.split("/")[0] in TOP_FOLDERS and "/" in word:
                refs.append(("code", word))
    return refs


# Paths of the installed package (the wheel's opbridge/ folder), not of the repository.
INSTALLED = ("include/", "lib/", "share/")


def _exists(name: str, doc: Path) -> bool:
    if name.startswith(INSTALLED) or ".dist-info/" in name or name in MADE:
        return True
    name = name.rstrip("/")
    if not name:
        return True
    candidates = [ROOT / name, doc.parent / name] + [ROOT / b / name for b in BASES]
    if re.search(r"[<>*]", name):
        # A path with a placeholder (`ops/<op>/<op>_decl.cpp`) or a glob: some file matches it.
        pattern = re.sub(r"<[^<>/]+>", "*", name)
        return any(glob.glob(str(base / pattern)) for base in [ROOT, doc.parent] + [ROOT / b for b in BASES])
    if any(c.exists() for c in candidates):
        return True
    # An op's header, by the include path it is installed at (opbridge_add_op: ops/<op>/<op>.h).
    op_header = re.fullmatch(r"opbridge/(\w+)\.h", name)
    if op_header and (ROOT / "ops" / op_header.group(1) / f"{op_header.group(1)}.h").is_file():
        return True
    return "/" not in name and (name in BASENAMES or name in NOT_OURS)


def _missing(doc: Path) -> list[str]:
    out = []
    for kind, name in _references(doc.read_text()):
        if not _exists(name, doc):
            out.append(f"{doc.relative_to(ROOT)}: {kind} {name!r}")
    return sorted(set(out))


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_named_file_exists(doc):
    missing = _missing(doc)
    assert not missing, "files the docs name that do not exist:\n" + "\n".join("  " + m for m in missing)


def test_the_reader_finds_references(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("See [the kernel](../ops/nothing.cpp), `cuda/common/adapter_checks.h`, `ort_attr.h`,\n"
                   "`ops/group_norm/group_norm_decl.cpp:12`, `<op>_decl.cpp` and `x = 1`.\n"
                   "```\nnot/in/a/fence.h\n```\n"
                   "Run `scripts/no_such.py examples/rms_norm`, `.ci/run`; see `ops/<op>/<op>_decl.cpp`,\n"
                   "`ops/<op>/<op>_nothing.cu` and `examples/no_such_example`.\n")
    assert _references(doc.read_text()) == [
        ("link", "../ops/nothing.cpp"), ("code", "cuda/common/adapter_checks.h"), ("code", "ort_attr.h"),
        ("code", "ops/group_norm/group_norm_decl.cpp"), ("code", "scripts/no_such.py"),
        ("code", "examples/rms_norm"), ("code", ".ci/run"), ("code", "ops/<op>/<op>_decl.cpp"),
        ("code", "ops/<op>/<op>_nothing.cu"), ("code", "examples/no_such_example")]
    missing = [name for kind, name in _references(doc.read_text()) if not _exists(name, ROOT / "docs" / "x.md")]
    assert missing == ["../ops/nothing.cpp", "cuda/common/adapter_checks.h", "ort_attr.h", "scripts/no_such.py",
                       "ops/<op>/<op>_nothing.cu", "examples/no_such_example"]
