"""pytest plugin for device tests that cannot hide each other (scripts/cuda_tests.py loads it).

A CUDA error such as an illegal memory access is sticky: once it has happened, every later
CUDA call in the process fails with it, so one bad kernel would fail every test after it (on the
first GPU run, one out-of-bounds read failed 168 tests). With this plugin:

* after every test's call phase the device is synchronized (``torch.cuda.synchronize()`` where
  torch has initialized CUDA), so an asynchronous error is charged to the test that caused it;
* a test whose failure is a CUDA error (or whose synchronize fails) is recorded as fatal, and the
  process ends right after its teardown: nothing later runs on a broken context;
* every test's start and each phase's outcome are written to a JSON-lines log as they happen,
  so the runner knows which test was running when a process died, even by a signal.

The runner (scripts/cuda_tests.py) starts pytest again after the last test the log names, until
every test has run, and reports the first failure first.

Environment: OPBRIDGE_CUDA_ISOLATION_LOG (the log; the plugin does nothing without it),
OPBRIDGE_CUDA_RESUME_AFTER (a node id: it and every test collected before it are deselected),
OPBRIDGE_CUDA_KERNEL_LOG (a file: the names of the opbridge kernels each test launched, from
torch's profiler, one per line; for the check that every kernel ran on the device).
"""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

LOG_ENV = "OPBRIDGE_CUDA_ISOLATION_LOG"
RESUME_ENV = "OPBRIDGE_CUDA_RESUME_AFTER"
KERNEL_LOG_ENV = "OPBRIDGE_CUDA_KERNEL_LOG"
# The exit status of a process ended after a fatal CUDA error (the runner resumes after it).
FATAL_EXIT = 86

# What a sticky or fatal CUDA error looks like in an exception's text (torch's and the CUDA
# runtime's wording).
CUDA_ERROR = re.compile(
    r"CUDA error|cudaError[A-Za-z]+|AcceleratorError|illegal memory access|illegal instruction|"
    r"misaligned address|device-side assert|unspecified launch failure|CUDA-capable device|"
    r"an illegal|CUBLAS_STATUS_EXECUTION_FAILED"
)

_fatal: dict[str, str] = {}


def _log(record: dict) -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _active() -> bool:
    return bool(os.environ.get(LOG_ENV))


def pytest_collection_modifyitems(config, items):
    after = os.environ.get(RESUME_ENV)
    if not _active() or not after:
        return
    ids = [it.nodeid for it in items]
    if after not in ids:
        return
    cut = ids.index(after) + 1
    config.hook.pytest_deselected(items=items[:cut])
    del items[:cut]


def pytest_runtest_logstart(nodeid, location):
    if _active():
        _log({"event": "start", "nodeid": nodeid})


def _sync_error() -> str | None:
    """The device's pending error, if torch has initialized CUDA in this process."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    try:
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - any failure here is the device's
        return f"{type(e).__name__}: {e}"
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """With OPBRIDGE_CUDA_KERNEL_LOG: records the opbridge kernels the test launched (not around
    graph captures, which the profiler would disturb)."""
    path = os.environ.get(KERNEL_LOG_ENV)
    torch = sys.modules.get("torch")
    if not (_active() and path and torch is not None and torch.cuda.is_available()) or "graph_capture" in item.name:
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CUDA])
    prof.__enter__()
    yield
    try:  # a broken context is reported by the synchronize in pytest_runtest_makereport
        torch.cuda.synchronize()
        prof.__exit__(None, None, None)
        names = {e.key for e in prof.key_averages() if "opbridge" in e.key}
    except Exception:  # noqa: BLE001
        return
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(n + "\n" for n in sorted(names))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if not _active():
        return
    report = outcome.get_result()
    if call.when == "call":
        err = _sync_error()
        if err is not None:
            # The test itself may have passed: the error surfaced only at the synchronize.
            report.outcome = "failed"
            report.longrepr = f"CUDA error pending after the test (torch.cuda.synchronize()): {err}"
            _fatal[item.nodeid] = err
    if report.failed and item.nodeid not in _fatal:
        text = str(report.longrepr)
        m = CUDA_ERROR.search(text)
        if m:
            _fatal[item.nodeid] = text[max(0, m.start() - 200) : m.end() + 300]


def pytest_runtest_logreport(report):
    if not _active():
        return
    message = ""
    if report.failed:
        message = str(report.longrepr).splitlines()[-1][:500] if report.longrepr else ""
    elif report.skipped and isinstance(report.longrepr, tuple):
        message = str(report.longrepr[2]).removeprefix("Skipped: ")[:300]
    _log({"event": report.when, "nodeid": report.nodeid, "outcome": report.outcome, "message": message,
          "fatal": report.nodeid in _fatal})


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_logfinish(nodeid, location):
    # After the test's teardown has been reported: end the process on a broken context.
    yield
    if _active() and nodeid in _fatal:
        _log({"event": "fatal", "nodeid": nodeid, "message": _fatal[nodeid][-800:]})
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(FATAL_EXIT)
