"""benchmarks/cpp/group_norm_vs_floor.cpp (GroupNorm's kernel against the memory floor) builds
against the installed package as its header says, its float64 check of the kernel passes, and it
prints one row per shape and layout; benchmarks/cpp/group_norm_ab.sh builds two versions of the
kernel into one program, times them side by side and tells where their outputs differ;
benchmarks/cpp/group_norm_passes.cpp times the channels-last kernel's two passes apart. The asv
suite's CUDA benchmarks skip at once where there is no GPU."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import opbridge
from helpers.cmake_helpers import REPO

SOURCE = REPO / "benchmarks" / "cpp" / "group_norm_vs_floor.cpp"
ROW = re.compile(
    r"^(?P<shape>\d+,\d+,\d+,\d+)\s+(?P<layout>contiguous|channels_last)\s+[\d.]+\s+"
    r"(?P<floor>[\d.]+)x\s+(?P<kernel>[\d.]+)x\s+(?P<silu>[\d.]+)x\s+(?P<err>\S+)$"
)


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    cxx = os.environ.get("CXX") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++ or $CXX)")
    package = Path(opbridge.__file__).parent
    library = package / "lib" / "libopbridge_kernels.a"
    if not library.is_file():
        pytest.skip(f"{library} is not installed")
    exe = tmp_path_factory.mktemp("gn_vs_floor") / "gn_vs_floor"
    # The build line of the program's header.
    cmd = [cxx, "-O2", "-std=c++17", "-march=native", "-fopenmp", f"-I{package / 'include'}", "-o", str(exe),
           str(SOURCE), str(library)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return exe


def run(program: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="2", **(env or {}))
    return subprocess.run([str(program), *args], capture_output=True, text=True, env=env, timeout=300)


def test_group_norm_vs_floor_checks_and_reports(program):
    # Odd sizes (tails of every vector loop, units that are no multiple of a vector), a
    # channels-last shape whose rows are whole vectors, and channels of 64 (the fused contiguous pass).
    result = run(program, "--rounds", "1", "--groups", "4", "3,12,5,7", "2,64,9,9", "3,16,8,8")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [m.groupdict() for m in map(ROW.match, result.stdout.splitlines()) if m]
    assert [(r["shape"], r["layout"]) for r in rows] == [
        ("3,12,5,7", "contiguous"), ("3,12,5,7", "channels_last"),
        ("2,64,9,9", "contiguous"), ("2,64,9,9", "channels_last"),
        ("3,16,8,8", "contiguous"), ("3,16,8,8", "channels_last"),
    ], result.stdout
    for r in rows:
        assert float(r["err"]) <= 1e-4, r
        assert all(float(r[k]) > 0 for k in ("floor", "kernel", "silu")), r
    assert "WRONG" not in result.stdout
    assert result.stdout.splitlines()[0].count(";") >= 4, result.stdout  # the machine line: CPU, threads, L2


CHOICES = re.compile(r"^kernel choices: L2 (?P<l2>\d+) KiB, L3 (?P<l3>\d+) KiB .*; cache budget (?P<budget>\d+) KiB "
                     r"\((?P<budget_streamed>\d+) KiB with streaming stores\); streaming stores from (?P<stream>\d+) KiB; "
                     r"channels-last waves of (?P<wave>\d+) KiB or more; \[N, C, S\] groups fused: (?P<fused>yes|no)"
                     r"(?P<set>.*)$", re.M)


def sysfs_cache_kib(level: int) -> int | None:
    """The data or unified cache of `level` that Linux reports for CPU 0, in KiB (None: no report)."""
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if int((index / "level").read_text()) == level and (index / "type").read_text().strip() != "Instruction":
                size = (index / "size").read_text().strip()
                return int(size[:-1]) * {"K": 1, "M": 1024}[size[-1]]
        except (OSError, ValueError, KeyError):
            return None
    return None


def test_group_norm_vs_floor_prints_the_kernel_choices(program):
    result = run(program, "--rounds", "1", "--groups", "4", "2,64,9,9")
    assert result.returncode == 0, result.stdout + result.stderr
    m = CHOICES.search(result.stdout)
    assert m is not None, result.stdout
    for level in (2, 3):
        kib = sysfs_cache_kib(level)
        if kib is not None:
            assert int(m[f"l{level}"]) == kib, (level, result.stdout)
    l2 = int(m["l2"])
    if l2 > 0:
        assert int(m["budget"]) == min(max(l2 // 2, 128), 8192), result.stdout
        assert int(m["budget_streamed"]) == 2 * int(m["budget"]), result.stdout
    l3 = int(m["l3"])
    assert int(m["stream"]) == expected_stream_kib(l2, l3), result.stdout
    assert int(m["wave"]) == int(m["l3"]) // 2, result.stdout
    assert m["fused"] == "yes" and m["set"] == "", result.stdout


def expected_stream_kib(l2_kib: int, l3_kib: int) -> int:
    """The streaming threshold for these caches (KiB): at least twice the L2, and a quarter of an
    L3 of at most 32 MiB (an EPYC's CCX); 4 MiB where there is no L3 or a larger one (a Xeon's mesh)."""
    return max(2 * l2_kib, l3_kib // 4 if 0 < l3_kib <= 32768 else 4096)


@pytest.mark.parametrize("l2, l3, stream_kib", [
    ("2M", "105M", 4096),   # a Xeon (2 MiB L2, 105 MiB mesh L3): streaming paid from 4 MiB
    ("2M", "260M", 4096),   # another Xeon
    ("1M", "32M", 8192),    # EPYC Zen 4 / Zen 5
    ("512K", "32M", 8192),  # EPYC Zen 3
    ("512K", "16M", 4096),  # a smaller CCX
    ("4M", "0", 8192),      # no L3 reported: twice the L2
    ("1M", "0", 4096),
])
def test_group_norm_choices_follow_the_cache_sizes(program, l2, l3, stream_kib):
    # OPBRIDGE_GROUP_NORM_L2_BYTES / _L3_BYTES stand for the sizes the OS reports: the choices are
    # those of a machine with these caches, whatever this one has.
    env = {"OPBRIDGE_GROUP_NORM_L2_BYTES": l2, "OPBRIDGE_GROUP_NORM_L3_BYTES": l3}
    result = run(program, "--rounds", "1", "--groups", "4", "2,64,9,9", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    m = CHOICES.search(result.stdout)
    assert m is not None, result.stdout
    l2_kib, l3_kib = (0 if s == "0" else int(s[:-1]) * {"K": 1, "M": 1024}[s[-1]] for s in (l2, l3))
    assert (int(m["l2"]), int(m["l3"])) == (l2_kib, l3_kib), result.stdout
    assert int(m["stream"]) == stream_kib == expected_stream_kib(l2_kib, l3_kib), result.stdout
    assert int(m["budget"]) == l2_kib // 2 and int(m["budget_streamed"]) == l2_kib, result.stdout
    assert int(m["wave"]) == l3_kib // 2, result.stdout
    assert "set by" in m["set"], result.stdout


def test_group_norm_vs_floor_overrides_stay_exact(program):
    # Streaming stores for every output and a budget below one sample: the streamed and tiled
    # paths at sizes that otherwise take neither, still checked against float64.
    env = {"OPBRIDGE_GROUP_NORM_STREAM_BYTES": "0", "OPBRIDGE_GROUP_NORM_CACHE_BUDGET": "4K",
           "OPBRIDGE_GROUP_NORM_WAVE_BYTES": "0", "OPBRIDGE_GROUP_NORM_FUSE": "0"}
    result = subprocess.run([str(program), "--rounds", "1", "--groups", "4", "3,12,5,7", "2,64,9,9"],
                            capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="2", **env),
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    m = CHOICES.search(result.stdout)
    assert m is not None and (m["budget"], m["budget_streamed"], m["stream"], m["wave"], m["fused"]) == (
        "4", "4", "0", "0", "no"), result.stdout
    assert "OPBRIDGE_GROUP_NORM" in m["set"], result.stdout
    rows = [r for r in map(ROW.match, result.stdout.splitlines()) if r]
    assert len(rows) == 4 and all(float(r["err"]) <= 1e-4 for r in rows), result.stdout


@pytest.mark.parametrize("args, message", [
    (["--groups", "5", "2,12,4,4"], "C is not a multiple of G = 5"),
    (["2,12,4"], "usage:"),
    (["--groups", "0", "2,12,4,4"], "C is not a multiple of G = 0"),
])
def test_group_norm_vs_floor_refuses_bad_arguments(program, args, message):
    result = run(program, *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stdout == ""


AB_SCRIPT = REPO / "benchmarks" / "cpp" / "group_norm_ab.sh"
AB_ROW = re.compile(r"^(?P<shape>\d+,\d+,\d+,\d+)\s+(?P<copy>[\d.]+)\s+(?P<read>[\d.]+)\s+(?P<scale>[\d.]+)\s+"
                    r"(?P<a>[\d.]+)x\s+(?P<b>[\d.]+)x\s+(?P<ba>[\d.]+)\s+(?P<differing>\d+)$")


@pytest.fixture(scope="module")
def ab_out(tmp_path_factory) -> Path:
    """One GN_AB_OUT for the module's A/B runs: the script keeps each object under a hash of its
    sources, so a side built once (the working tree's headers) is not compiled again."""
    return tmp_path_factory.mktemp("gn_ab")


def run_ab(out: Path, a_dir: Path, b_dir: Path, *args: str,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """benchmarks/cpp/group_norm_ab.sh with A and B taken from the folders a_dir and b_dir, built in out."""
    cxx = os.environ.get("CXX") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++ or $CXX)")
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    if not {"avx2", "fma", "f16c"} <= set(flags):
        pytest.skip("the A/B program is built for AVX2 and FMA, which this CPU lacks")
    if not (Path(opbridge.__file__).parent / "lib" / "libopbridge_kernels.a").is_file():
        pytest.skip("opbridge's libopbridge_kernels.a is not installed")
    env = dict(os.environ, PYTHON=sys.executable, GN_AB_A=str(a_dir), GN_AB_B=str(b_dir),
               GN_AB_OUT=str(out), OMP_NUM_THREADS="2", CXX=cxx, **(env or {}))
    return subprocess.run(["bash", str(AB_SCRIPT), *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=600)


def header_copy(folder: Path, replace: tuple[str, str] | None = None,
                header: str = "group_norm_simd.h") -> Path:
    """A folder holding the working tree's group_norm_simd.h and group_norm_backward_simd.h, with
    one string of `header` replaced if asked."""
    folder.mkdir(parents=True)
    for name in ("group_norm_simd.h", "group_norm_backward_simd.h"):
        text = (REPO / "ops" / "group_norm" / name).read_text()
        if replace is not None and name == header:
            assert text.count(replace[0]) == 1, replace[0]
            text = text.replace(*replace)
        (folder / name).write_text(text)
    return folder


def test_group_norm_ab_times_two_headers_side_by_side(tmp_path, ab_out):
    # The same header on both sides: the outputs agree bit for bit, and a row per shape (a
    # channels-last shape whose samples are cut into tiles, odd sizes) with every ratio positive.
    # B streams every output (GN_AB_B_STREAM_BYTES=0), A none: streaming stores store the same
    # values. Built for AVX-512 where the CPU has it (GN_AB_ISA), the set the library runs there.
    a = header_copy(tmp_path / "a")
    isa = "avx512" if "avx512bw" in Path("/proc/cpuinfo").read_text().split() else "avx2"
    result = run_ab(ab_out, a, REPO / "ops" / "group_norm", "--rounds", "1", "--groups", "4",
                    "2,128,40,40", "3,12,5,7", env={"GN_AB_B_STREAM_BYTES": "0", "GN_AB_ISA": isa,
                                                  "OPBRIDGE_GROUP_NORM_STREAM_BYTES": "1G"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("AVX-512" if isa == "avx512" else "AVX2"), result.stdout
    assert re.search(r"^B: stream_bytes 0, cache_budget (\d+) \(streamed (\d+)\), wave_bytes (\d+), fuse_groups 1 "
                     r"\(A: 1073741824, \1 \(\2\), \3, 1\)$", result.stdout, re.M), result.stdout
    rows = [m.groupdict() for m in map(AB_ROW.match, result.stdout.splitlines()) if m]
    assert [r["shape"] for r in rows] == ["2,128,40,40", "3,12,5,7"], result.stdout
    for r in rows:
        assert r["differing"] == "0", r
        # The copy's time is printed in whole tenths of a µs: 0.0 for the smallest shape on a fast CPU.
        assert float(r["copy"]) >= 0 and all(float(r[k]) > 0 for k in ("read", "scale", "a", "b", "ba")), r


def test_group_norm_ab_gives_b_another_cache_budget_and_wave(tmp_path, ab_out):
    # GN_AB_B_CACHE_BUDGET / GN_AB_B_WAVE_BYTES: B's kernels take them (printed beside A's), and
    # a budget of 0 or a malformed size is refused with status 2.
    a = header_copy(tmp_path / "a")
    result = run_ab(ab_out, a, REPO / "ops" / "group_norm", "--rounds", "1", "--groups", "4", "2,128,40,40",
                    env={"GN_AB_B_CACHE_BUDGET": "64K", "GN_AB_B_WAVE_BYTES": "1M"})
    assert result.returncode in (0, 1), result.stdout + result.stderr
    assert re.search(r"^B: stream_bytes (\d+), cache_budget 65536 \(streamed 65536\), wave_bytes 1048576, "
                     r"fuse_groups \d \(A: \1, \d+ \(\d+\), \d+, \d\)$", result.stdout, re.M), result.stdout
    rows = [m.groupdict() for m in map(AB_ROW.match, result.stdout.splitlines()) if m]
    assert [r["shape"] for r in rows] == ["2,128,40,40"], result.stdout
    for bad in ({"GN_AB_B_CACHE_BUDGET": "0"}, {"GN_AB_B_WAVE_BYTES": "1X"}):
        result = run_ab(ab_out, a, REPO / "ops" / "group_norm", "--rounds", "1", "2,128,40,40", env=bad)
        assert result.returncode == 2 and "GN_AB_B_CACHE_BUDGET" in result.stderr, (bad, result.stderr)


def test_group_norm_ab_reports_outputs_that_differ(tmp_path, ab_out):
    # B with Chan's update of the running mean off by a part in 10^4: the program counts the
    # elements that differ from A's and exits with status 1 (in both layouts). The second run has
    # the first's headers: it compiles nothing, and B is the changed header, not a kept object.
    a = header_copy(tmp_path / "a")
    b = header_copy(tmp_path / "b", ("  *mean += delta * w_new;", "  *mean += delta * w_new * 1.0001;"))
    objects = []
    for layout in ([], ["--nchw"]):
        result = run_ab(ab_out, a, b, "--rounds", "1", "--groups", "4", *layout, "3,12,5,7")
        assert result.returncode == 1, result.stdout + result.stderr
        rows = [m.groupdict() for m in map(AB_ROW.match, result.stdout.splitlines()) if m]
        assert len(rows) == 1 and int(rows[0]["differing"]) > 0, result.stdout
        objects.append({p.name: p.stat().st_mtime_ns for p in ab_out.glob("*.o")})
    assert objects[0] == objects[1], objects


def test_group_norm_ab_times_the_backward(tmp_path, ab_out):
    # --backward: the same headers on both sides agree bit for bit (dx, the sums, rstd; both
    # layouts, with SiLU); B's backward with its dx coefficient k2 off by a part in 10^4 differs,
    # and the program exits with status 1.
    a = header_copy(tmp_path / "a")
    shapes = ["2,128,40,40", "3,12,5,7"]
    for layout in ([], ["--nchw"]):
        result = run_ab(ab_out, a, REPO / "ops" / "group_norm", "--rounds", "1", "--groups", "4", "--backward",
                        "--silu", *layout, *shapes)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "backward" in result.stdout.splitlines()[0], result.stdout
        rows = [m.groupdict() for m in map(AB_ROW.match, result.stdout.splitlines()) if m]
        assert [r["shape"] for r in rows] == shapes and all(r["differing"] == "0" for r in rows), result.stdout
    b = header_copy(tmp_path / "b", ("*k2 = static_cast<float>(-rstd", "*k2 = 1.0001f * static_cast<float>(-rstd"),
                    header="group_norm_backward_simd.h")
    for layout in ([], ["--nchw"]):
        result = run_ab(ab_out, a, b, "--rounds", "1", "--groups", "4", "--backward", *layout, "3,12,5,7")
        assert result.returncode == 1, result.stdout + result.stderr
        rows = [m.groupdict() for m in map(AB_ROW.match, result.stdout.splitlines()) if m]
        assert len(rows) == 1 and int(rows[0]["differing"]) > 0, result.stdout


PASSES_SOURCE = REPO / "benchmarks" / "cpp" / "group_norm_passes.cpp"
PASSES_ROW = re.compile(r"^(?P<shape>\d+,\d+,\d+,\d+)\s+(?P<tiles>\d+)\s+(?P<copy>[\d.]+)\s+(?P<read>[\d.]+)\s+"
                        r"(?P<scale>[\d.]+)\s+(?P<stats>[\d.]+)\s+(?P<normalize>[\d.]+)\s+(?P<kernel>[\d.]+)\s+"
                        r"(?P<streamed>yes|no)\s+(?P<differing>\d+)$")


def test_group_norm_passes_times_each_pass(tmp_path):
    """benchmarks/cpp/group_norm_passes.cpp, built as its header says: the channels-last kernel's
    two passes alone give the kernel's output bit for bit (rows of whole vectors, and rows of 12
    channels, taken in periods), with a row per shape; a shape whose samples fit the cache budget
    is refused. Where the CPU has AVX-512, built for it as well (the kernel the library dispatches
    to there), and the header says which instruction set was timed."""
    cxx = os.environ.get("CXX") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++ or $CXX)")
    flags = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else set()
    if not {"avx2", "fma", "f16c"} <= flags:
        pytest.skip("the program is built for AVX2 and FMA, which this CPU lacks")
    library = Path(opbridge.__file__).parent / "lib" / "libopbridge_kernels.a"
    if not library.is_file():
        pytest.skip(f"{library} is not installed")
    builds = [("AVX2", [])]
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        builds.append(("AVX-512", ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"]))
    env = dict(os.environ, OMP_NUM_THREADS="2")
    for isa, isa_flags in builds:
        exe = tmp_path / f"gn_passes_{isa}"
        cmd = [cxx, "-O3", "-std=c++17", "-mavx2", "-mfma", "-mf16c", *isa_flags, "-fopenmp", "-Iops/group_norm",
               "-Icpp", "-Icpp/include", "-Ibenchmarks/cpp", str(PASSES_SOURCE), str(library), "-o", str(exe)]
        result = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        assert result.returncode == 0, result.stderr
        cases = [(["2,128,40,40"], "2,128,40,40")]
        if isa == "AVX2":
            cases.append((["--groups", "4", "--silu", "2,12,40,40"], "2,12,40,40"))
        for args, shape in cases:
            result = subprocess.run([str(exe), "--rounds", "1", *args], capture_output=True, text=True, env=env,
                                    timeout=300)
            assert result.returncode == 0, result.stdout + result.stderr
            assert result.stdout.startswith(f"{isa}; 2 threads;"), result.stdout
            rows = [m.groupdict() for m in map(PASSES_ROW.match, result.stdout.splitlines()) if m]
            assert [r["shape"] for r in rows] == [shape], result.stdout
            assert rows[0]["differing"] == "0" and int(rows[0]["tiles"]) >= 1, rows
            assert all(float(rows[0][k]) > 0 for k in ("copy", "read", "scale", "stats", "normalize", "kernel")), rows
        result = subprocess.run([str(exe), "--rounds", "1", "64,32,8,8"], capture_output=True, text=True, env=env,
                                timeout=300)
        assert result.returncode == 2 and "fit the cache budget" in result.stderr, result.stdout + result.stderr


def test_cuda_kernel_bench_compiles(tmp_path):
    """benchmarks/cuda/kernel_bench.cu (the launchers timed without torch, for GPU machines)
    compiles with nvcc wherever the CUDA kernels are built (it runs only on a GPU)."""
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if nvcc is None:
        pytest.skip("no nvcc on this machine")
    src = REPO / "benchmarks" / "cuda" / "kernel_bench.cu"
    cmd = [nvcc, "-std=c++17", "-arch=sm_90", f"-I{REPO}", f"-I{REPO / 'cuda'}", f"-I{REPO / 'cpp' / 'include'}",
           "-c", str(src), "-o", str(tmp_path / "kernel_bench.o")]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_cuda_benchmarks_skip_at_once_without_a_gpu():
    """benchmarks/benchmarks/bench_cuda.py where there is no GPU: one parameter combination per
    benchmark, whose setup raises NotImplementedError (asv: skipped) without importing torch. (asv
    starts a process per benchmark and combination: 438 of them, each importing torch, took about
    an hour on 2 cores.)"""
    code = textwrap.dedent("""
        import inspect, itertools, sys
        sys.path.insert(0, "benchmarks")
        from benchmarks import bench_cuda as b
        if b.NO_GPU is None:
            print("GPU")
            raise SystemExit
        classes = [c for _, c in inspect.getmembers(b, inspect.isclass) if c.__module__ == b.__name__]
        assert len(classes) >= 4
        for c in classes:
            combos = list(itertools.product(*c.params))
            assert len(combos) == 1 and len(c.params) == len(c.param_names), (c, c.params)
            try:
                c().setup(*combos[0])
            except NotImplementedError as e:
                assert "no CUDA device" in str(e) or "torch is not installed" in str(e)
            else:
                raise AssertionError(f"{c.__name__}.setup did not skip")
        assert "torch" not in sys.modules
        print("skipped", len(classes))
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    if r.stdout.strip() == "GPU":
        pytest.skip("this machine has an NVIDIA device: the benchmarks run")
    assert r.stdout.startswith("skipped"), r.stdout


@pytest.mark.parametrize("args, quick", [("run --quick", True), ("run", False)])
def test_benchmarks_know_an_asv_quick_run(tmp_path, args, quick):
    # asv tells benchmarks nothing of --quick: _common reads it from an ancestor's command line
    # (then speed-ups take one round, so that the model benchmarks finish in minutes).
    import stat

    asv = tmp_path / "asv"
    code = "import sys; sys.path.insert(0, sys.argv[1]); from benchmarks import _common; print(_common.QUICK)"
    asv.write_text(f'#!/bin/sh\n"{sys.executable}" -c "{code}" "$BENCH_ROOT"\n')
    asv.chmod(asv.stat().st_mode | stat.S_IEXEC)
    env = {k: v for k, v in os.environ.items() if k != "OPBRIDGE_BENCH_QUICK"}
    env["BENCH_ROOT"] = str(Path(__file__).resolve().parents[2] / "benchmarks")
    out = subprocess.run([str(asv), *args.split()], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == str(quick), out


def test_compare_ort_libraries_times_every_case_on_one_library():
    """benchmarks/compare_ort_libraries.py (two builds side by side) builds a model of each case that
    the installed library runs, checks the two sessions' outputs against each other and prints a row
    per case; the same library on both sides gives a ratio near 1 (a loose bound: one round)."""
    library = Path(opbridge.__file__).parent / "libopbridge_ort.so"
    script = REPO / "benchmarks" / "compare_ort_libraries.py"
    result = subprocess.run([sys.executable, str(script), str(library), str(library), "--rounds", "1", "--runs", "1"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if "new/old" in line and " us " in line]
    names = {line.split(" old ")[0].split()[0] for line in rows}
    assert names == {"GroupNorm", "Inverse", "MSDA", "furthest_point_sample", "ball_query", "knn",
                     "grouping_operation", "gather_points", "three_nn", "three_interpolate"}, result.stdout
    for line in rows:
        ratio = float(re.search(r"new/old (\S+)", line).group(1))
        assert 0.05 < ratio < 20, line


def test_compare_ort_libraries_times_given_group_norm_shapes():
    """--group-norm replaces the cases with GroupNorm at the shapes given (',silu': fused SiLU),
    --rtol is accepted beside it; a shape that is no N,C,H,W with C a multiple of 32 is refused."""
    library = Path(opbridge.__file__).parent / "libopbridge_ort.so"
    script = REPO / "benchmarks" / "compare_ort_libraries.py"
    cmd = [sys.executable, str(script), str(library), str(library), "--rounds", "1", "--runs", "1", "--threads", "2"]
    result = subprocess.run([*cmd, "--rtol", "1e-6", "--group-norm", "2,64,8,8", "1,32,5,7,silu"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = [line.split(" old ")[0].strip() for line in result.stdout.splitlines() if "new/old" in line and " us " in line]
    assert rows == ["GroupNorm (2, 64, 8, 8)", "GroupNorm (1, 32, 5, 7) silu"], result.stdout
    assert "differ" not in result.stdout, result.stdout  # the same library: the same bits
    for bad in ("2,30,8,8", "2,64,8", "2,64,8,x"):
        result = subprocess.run([*cmd, "--group-norm", bad], capture_output=True, text=True, timeout=300)
        assert result.returncode == 2 and "N,C,H,W[,silu]" in result.stderr and bad in result.stderr, result.stderr


def test_group_norm_ab_refuses_an_unknown_instruction_set(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, GN_AB_OUT=str(tmp_path), GN_AB_ISA="sse2")
    result = subprocess.run(["bash", str(AB_SCRIPT), "1,32,8,8"], capture_output=True, text=True, env=env, cwd=REPO,
                            timeout=120)
    assert result.returncode == 2 and "GN_AB_ISA must be avx2 or avx512, got 'sse2'" in result.stderr, result.stderr
    assert not (tmp_path / "gn_ab").exists()
