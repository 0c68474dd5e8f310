"""Every shared library of the package exports its entry points and nothing else.

A library that also exports what it links statically (weak std:: instantiations; all of libstdc++
where the toolchain links it statically, as GCC 13.3 in /opt/gcc does) shares those symbols with
whatever the process loaded first: with torch imported, _core's first ostream insertion ran half in
torch's libstdc++ and crashed (H200 machine, 2026-11-30). Version scripts
(cmake/opbridge_ops.cmake, opbridge_export_only) keep each library's own."""
from __future__ import annotations

from pathlib import Path

import pytest

import opbridge

from helpers import elf
from helpers.elf import C_ABI


def _expected(name: str) -> set[str] | None:
    if name == "libopbridge_ort.so":
        return {"RegisterCustomOps"} | C_ABI
    if name == "libopbridge_torch.so":
        return C_ABI
    if name == "libopbridge_torch_fastpath.so":
        return set()
    if name.startswith("_core."):
        return {"PyInit__core"} | C_ABI
    return None


def test_each_library_exports_its_entry_points_only():
    libs = sorted(Path(opbridge.__file__).parent.glob("*.so"))
    assert any(p.name == "libopbridge_ort.so" for p in libs), libs
    for lib in libs:
        want = _expected(lib.name)
        if want is None:
            pytest.fail(f"{lib.name}: a library this test does not know: say what it exports")
        got = elf.exported(lib)
        assert got == want, f"{lib.name} exports {sorted(got - want)[:20]} beyond its entry points; lacks {sorted(want - got)}"
