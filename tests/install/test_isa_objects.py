"""The per-instruction-set kernel code (``<op>_cpu_<isa>.cpp``, compiled with -mavx2 / -mavx512f by
opbridge_add_op) runs only where the dispatch chose it.

Two ways it could run elsewhere: a static initializer in an ISA object (it runs when the library is
loaded, on every CPU), and a weak symbol (a template instantiation such as
``std::vector<float>::_M_fill_assign``, an inline function) that an ISA object and a baseline object
both define: the linker keeps one copy, and if it keeps the AVX one, baseline code calls AVX
instructions (a crash on a CPU without them, decided by link order alone). So: no ISA object has a
static initializer, and no function that other code of a built library can call (global or weak
binding) holds an AVX instruction unless it is one of the ISA functions themselves (named
``*_avx2`` / ``*_avx512`` by OPBRIDGE_ISA_FN). Functions local to an ISA object are called only from
it.

Read from the build tree of this checkout (scikit-build-core's build-dir, build/{wheel_tag}; the
installed libraries are stripped); the test skips where the package was not built here.
"""

from __future__ import annotations

import bisect
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.cmake_helpers import REPO

LIBRARIES = ("libopbridge_ort.so", "libopbridge_torch.so", "libopbridge_torch_fastpath.so", "_core.*.so")
# VEX / EVEX-encoded instructions all start with "v" (vmovdqa, vpxor, vzeroupper, ...); verr / verw
# are the only other x86 mnemonics that do.
AVX = re.compile(r"^\s*([0-9a-f]+):\s+v(?!err\b|erw\b)[a-z0-9]+\b")
ISA_NAME = re.compile(r"_avx2|_avx512")


def _build_trees() -> list[Path]:
    return sorted(p.parent.parent for p in (REPO / "build").glob("*/CMakeFiles/*/opbridge_isa"))


def _tools_or_skip() -> list[Path]:
    if not all(shutil.which(t) for t in ("nm", "objdump", "c++filt")):
        pytest.skip("needs nm, objdump and c++filt (binutils)")
    trees = _build_trees()
    if not trees:
        pytest.skip(f"no build tree with per-ISA kernel objects under {REPO / 'build'}: not built in this checkout")
    return trees


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def test_isa_objects_have_no_static_initializers():
    for cmake_files in _tools_or_skip():
        objects = sorted(cmake_files.glob("*/opbridge_isa/**/*.o"))
        assert objects, cmake_files
        found = {obj.name: [line.split()[-1] for line in _run("nm", "--defined-only", str(obj)).splitlines()
                            if "_GLOBAL__sub_I" in line] for obj in objects}
        assert not {k: v for k, v in found.items() if v}, found


def callable_functions_with_avx(lib: Path) -> list[str]:
    """Demangled names of the functions of `lib` with global or weak binding whose code holds an AVX
    instruction, the ISA functions (``*_avx2`` / ``*_avx512``) left out."""
    avx = sorted(int(m.group(1), 16) for line in _run("objdump", "-d", "--no-show-raw-insn", str(lib)).splitlines()
                 if (m := AVX.match(line)))
    bad = []
    for line in _run("nm", "-S", "--defined-only", str(lib)).splitlines():
        fields = line.split()
        if len(fields) != 4 or fields[2] not in "TW":  # global or weak code
            continue
        start, size = int(fields[0], 16), int(fields[1], 16)
        i = bisect.bisect_left(avx, start)
        if i < len(avx) and avx[i] < start + size:
            bad.append(fields[3])
    names = _run("c++filt", *bad).splitlines() if bad else []
    return [n for n in names if not ISA_NAME.search(n)]


def test_no_callable_function_of_a_library_holds_avx_code_outside_the_isa_functions():
    for cmake_files in _tools_or_skip():
        libraries = [p for pattern in LIBRARIES for p in cmake_files.parent.glob(pattern)]
        assert libraries, cmake_files.parent
        for lib in libraries:
            offending = callable_functions_with_avx(lib)
            assert not offending, f"{lib.name}: callable functions with AVX code:\n" + "\n".join(offending[:20])


def test_the_check_finds_an_avx_copy_the_linker_kept(tmp_path):
    """The check above on a library built to go wrong: an AVX2 object and a baseline object both
    instantiate std::vector<float>'s fill, the AVX2 one first on the link line, so the linker keeps
    its copy for both."""
    cxx = shutil.which("g++")
    if cxx is None or not all(shutil.which(t) for t in ("nm", "objdump", "c++filt")):
        pytest.skip("needs g++ and binutils")
    body = "#include <vector>\nvoid {name}(std::vector<float>& v, unsigned long n) {{ v.assign(n, 1.5f); }}\n"
    (tmp_path / "isa.cpp").write_text(body.format(name="fill_isa"))
    (tmp_path / "base.cpp").write_text(body.format(name="fill_base"))
    lib = tmp_path / "libmixed.so"
    subprocess.run([cxx, "-O2", "-fPIC", "-shared", "-mavx2", "-c", str(tmp_path / "isa.cpp"), "-o",
                    str(tmp_path / "isa.o")], check=True)
    subprocess.run([cxx, "-O2", "-fPIC", "-c", str(tmp_path / "base.cpp"), "-o", str(tmp_path / "base.o")], check=True)
    subprocess.run([cxx, "-shared", "-o", str(lib), str(tmp_path / "isa.o"), str(tmp_path / "base.o")], check=True)
    found = callable_functions_with_avx(lib)
    assert any("_M_fill_assign" in n for n in found), found
    assert not any(n.startswith("fill_base") for n in found), found
