"""LeakSanitizer for the sanitized test runs (scripts/sanitize.sh), limited to opbridge's own leaks.

The interpreter, numpy and onnxruntime leave memory behind on purpose (interned objects, static
registries), so a plain at-exit leak check fails every Python process. Instead each process that
runs opbridge code asks LSan for a leak report at a moment of its choosing
(``__lsan_do_recoverable_leak_check``, which reports without exiting), keeps only the leaks whose
allocation stack passes through opbridge's native code (the ORT library, the _core module, any
``opbridge::`` function), and writes those to ``$OPBRIDGE_LSAN_DIR/leaks.<pid>.txt``. The pytest
process does so when the session ends (this module is loaded as a plugin: ``-p lsan``) and fails
the run if any process left a report there; the fuzz worker does so when it shuts down.

Requirements, set by scripts/sanitize.sh: libasan preloaded, ``ASAN_OPTIONS`` with
``detect_leaks=1:leak_check_at_exit=0``, ``PYTHONMALLOC=malloc`` (without it, objects in pymalloc's
mmap'd arenas are invisible to LSan's scan, so live memory that only they point to -- a numpy
array's buffer made by _core -- would be reported as leaked). Stacks are unwound through frame
pointers (fast_unwind_on_malloc), which the sanitized build keeps; an allocation that ORT makes
for us (an OrtStatus we failed to release) has ORT's frames on top, which have no frame pointers,
and is not attributed to us: such leaks show up in tests/reliability/test_leaks.py's RSS checks only if large.
"""

from __future__ import annotations

import ctypes
import gc
import glob
import os
import re
import tempfile

ENV_DIR = "OPBRIDGE_LSAN_DIR"

# A stack frame in opbridge's native code: a symbol in namespace opbridge, or an address in the
# ORT library or the _core extension (which also holds nanobind's code).
_OURS = re.compile(r"\bopbridge::|libopbridge_ort\.so|/opbridge/_core[^/\s]*\.so|/cpp/(ort|common|python)/"
                   r"|/ops/\w+/\w+\.(cpp|h|cu|cuh)\b")
_LEAK_START = re.compile(r"^(Direct|Indirect) leak of ")


def enabled() -> bool:
    return ("asan" in os.environ.get("LD_PRELOAD", "") and "detect_leaks=1" in os.environ.get("ASAN_OPTIONS", "")
            and bool(os.environ.get(ENV_DIR)))


def ours(report: str) -> list[str]:
    """The leak records of an LSan report whose stack has an opbridge frame."""
    records: list[list[str]] = []
    for line in report.splitlines():
        if _LEAK_START.match(line):
            records.append([line])
        elif records and line.strip().startswith("#"):
            records[-1].append(line)
    return ["\n".join(r) for r in records if any(_OURS.search(frame) for frame in r[1:])]


_pinned = []


def pin_library() -> None:
    """Keeps opbridge's ORT library mapped for the rest of the process. ORT unloads a custom-op
    library when the last session options that registered it go away, and LSan can then no longer
    tell which module an allocation's return addresses were in ("<unknown module>"), so the leak
    would not be attributed to us. RTLD_NODELETE makes every later dlclose a no-op; the library
    then stays at one address. (So under LSan the library is loaded once per process instead of
    once per session.)"""
    if not enabled() or _pinned:
        return
    import opbridge

    _pinned.append(ctypes.CDLL(opbridge.get_library_path(), mode=os.RTLD_NOW | os.RTLD_NODELETE))


def check(where: str) -> list[str]:
    """Runs LSan's leak check now; writes opbridge's leaks (if any) to $OPBRIDGE_LSAN_DIR and
    returns them."""
    if not enabled():
        return []
    rt = ctypes.CDLL(None)  # libasan is preloaded: its interface functions are global
    gc.collect()
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "lsan")
        # Only this report goes to the file: ASan reports go back to stderr right after.
        rt.__sanitizer_set_report_path(prefix.encode())
        try:
            rt.__lsan_do_recoverable_leak_check()
        finally:
            rt.__sanitizer_set_report_path(b"stderr")
        report = "".join(open(p, errors="replace").read() for p in sorted(glob.glob(prefix + "*")))
    leaks = ours(report)
    if leaks:
        out = os.path.join(os.environ[ENV_DIR], f"leaks.{os.getpid()}.txt")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w") as f:
            f.write(f"{where} (pid {os.getpid()}): {len(leaks)} leak(s) through opbridge code\n\n")
            f.write("\n\n".join(leaks) + "\n")
    return leaks


# ---- pytest plugin ------------------------------------------------------------------------------


def pytest_sessionstart(session):
    pin_library()


def pytest_sessionfinish(session, exitstatus):
    if not enabled():
        return
    check("pytest")
    reports = sorted(glob.glob(os.path.join(os.environ[ENV_DIR], "leaks.*.txt")))
    if reports:
        text = "\n".join(open(p).read() for p in reports)
        print(f"\nLeakSanitizer: opbridge code leaked memory ({len(reports)} process(es)):\n{text}")
        session.exitstatus = 1


def pytest_report_header(config):
    if enabled():
        return f"LeakSanitizer: on (opbridge's leaks; reports in {os.environ[ENV_DIR]})"
    return None
