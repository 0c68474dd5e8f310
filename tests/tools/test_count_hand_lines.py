"""scripts/count_hand_lines.py, the count of hand-written lines that docs/declarations.md and
docs/cpp.md quote: it works on a project that is a git repository with caches and build folders
beside the sources, counts only what differs from the scaffold, and (with ruff and clang-format
installed, as the test requirements have them) is not changed by how the lines are wrapped."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from opbridge._newop import new_op

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("count_hand_lines", ROOT / "scripts" / "count_hand_lines.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _project(tmp_path: Path) -> Path:
    project = new_op("seg_sum", dir=tmp_path / "segops").dir
    cpu = project / "ops" / "seg_sum" / "seg_sum_cpu.cpp"
    text = cpu.read_text()
    # Three hand-written statements, one of them wrapped over three lines.
    cpu.write_text(text + "\nint hand_one() { return 1; }\nint hand_two() {\n  return\n      2;\n}\n")
    py = project / "python" / "segops" / "extra.py"
    py.write_text("# a comment\n\nVALUE = (\n    1\n    + 2\n)\n")
    return project


def test_counts_the_hand_written_lines(tmp_path, capsys):
    project = _project(tmp_path)
    # A git repository with a binary index, caches, a build folder and a venv-like folder.
    if shutil.which("git"):
        subprocess.run(["git", "init", "-q", str(project)], check=True)
        subprocess.run(["git", "-C", str(project), "add", "-A"], check=True)
    for junk in (".pytest_cache/v/cache", "build/cp311", ".venv/lib", "dist", "segops.egg-info"):
        (project / junk).mkdir(parents=True, exist_ok=True)
        (project / junk / "data.py").write_text("X = 1\nY = 2\n")
    (project / "ops" / "seg_sum" / "blob.bin").write_bytes(bytes(range(256)))
    mod = _script()
    fmt = mod.formatters()
    mod.main([str(project), "seg_sum"])
    out = capsys.readouterr().out
    per_file = dict(line.rsplit(": ", 1) for line in out.splitlines() if not line.startswith("total"))
    assert set(per_file) == {"ops/seg_sum/seg_sum_cpu.cpp", "python/segops/extra.py"}, out
    if "cpp" in fmt and "python" in fmt:
        # Formatted, each short function is one line (hand_two was written over five) and the
        # Python assignment is one line (written over four).
        assert per_file["ops/seg_sum/seg_sum_cpu.cpp"] == "2" and per_file["python/segops/extra.py"] == "1", out
    else:
        pytest.skip(f"ruff / clang-format not installed: the formatted count is not checked ({out.strip()})")


def test_formatting_makes_the_count_independent_of_wrapping(tmp_path):
    mod = _script()
    fmt = mod.formatters()
    if "cpp" not in fmt or "python" not in fmt:
        pytest.skip("needs ruff and clang-format (requirements/test.txt)")
    a, b = tmp_path / "a", tmp_path / "b"
    for d, body in ((a, "int f(int x, int y) { return x + y; }\n"), (b, "int f(int x,\n      int y)\n{\n return x\n + y;\n}\n")):
        d.mkdir()
        (d / "k.cpp").write_text(body)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert mod.count(a, empty, fmt)[0] == mod.count(b, empty, fmt)[0]
    assert mod.count(a, empty, {})[0] != mod.count(b, empty, {})[0]  # unformatted they differ


def test_several_ops_each_get_their_own_files(tmp_path, capsys):
    # A project of two ops, made as new-op makes them (the second added with --dir): each op's own
    # files count for it, the rest (here the extra Python module) as shared.
    project = _project(tmp_path)
    new_op("other_op", dir=project)
    (project / "ops" / "other_op" / "other_op_cpu.cpp").write_text(
        (project / "ops" / "other_op" / "other_op_cpu.cpp").read_text() + "\nint other() { return 3; }\n")
    mod = _script()
    mod.main([str(project), "seg_sum", "other_op", "--no-format"])
    out = capsys.readouterr().out
    lines = dict(line.rsplit(": ", 1) for line in out.splitlines() if not line.startswith("total"))
    assert lines["op other_op"] == "1", out
    assert int(lines["op seg_sum"]) == int(lines["ops/seg_sum/seg_sum_cpu.cpp"]) > 0, out
    assert int(lines["shared"]) == int(lines["python/segops/extra.py"]) > 0, out
    assert "CMakeLists.txt" not in lines, out  # the second op's opbridge_add_op line is new-op's
