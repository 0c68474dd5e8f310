"""Parent side of the fuzz harness: a long-lived worker process (worker.py) runs many cases; a
case that kills it (crash) or stalls it (hang) is recorded and a fresh worker takes over.

A Case holds what the worker needs (`payload`, plain picklable data) and what the parent judges
the outcome by (`expect`, see oracle.py). Verdicts: "pass", "fail" (wrong result, or an error
that is unexpected or unclear), "crash", "hang".
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import oracle

WORKER = str(Path(__file__).with_name("worker.py"))
_HEADER_SIZE = 8

# Generous: a normal case takes milliseconds, but the dev machine has 2 cores shared by several
# people and a sanitizer build is ~3x slower. Only a genuine hang should take this long.
DEFAULT_TIMEOUT_S = 60.0
# The first request imports onnxruntime / torch.
STARTUP_TIMEOUT_S = 180.0
# Address-space cap for a worker (see worker.py). 16 GiB: far above what any case may use (a few
# MiB), low enough that a runaway allocation fails instead of swapping.
RLIMIT_AS = 16 << 30


@dataclasses.dataclass
class Case:
    op: str  # snake_case op name, e.g. "group_norm"
    kind: str  # "ort" or "torch"
    desc: str  # one line a human can read: shape, dtype, attributes, what is special
    payload: dict  # what the worker runs (plain data: bytes, numpy arrays, numbers, strings)
    expect: Any  # oracle.Expect

    def __repr__(self) -> str:  # hypothesis prints this for a falsifying example
        return f"Case({self.op}/{self.kind}: {self.desc})"


@dataclasses.dataclass
class Result:
    verdict: str  # pass / fail / crash / hang
    detail: str  # why (empty for pass)
    reply: Any = None  # what the worker answered, when it did


def under_asan() -> bool:
    """Whether this process runs with AddressSanitizer preloaded (scripts/sanitize.sh)."""
    return "asan" in os.environ.get("LD_PRELOAD", "")


class Worker:
    """One worker process; restarted on demand after a crash or hang."""

    def __init__(self, modules=("ort",), timeout_s: float = DEFAULT_TIMEOUT_S):
        self.modules = tuple(modules)
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self._stderr = tempfile.TemporaryFile()

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        env = dict(os.environ)
        if not under_asan() and os.environ.get("OPBRIDGE_FUZZ_DEVICE", "cpu") == "cpu":
            # (Not with CUDA: a CUDA context reserves far more address space than any limit.)
            env["OPBRIDGE_FUZZ_RLIMIT_AS"] = str(RLIMIT_AS)
        self._stderr.seek(0)
        self._stderr.truncate()
        self.proc = subprocess.Popen([sys.executable, "-u", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, env=env)
        status, reply = self._call({"kind": "init", "modules": self.modules}, STARTUP_TIMEOUT_S)
        if status != "ok" or reply[0] != "ok":
            raise RuntimeError(f"fuzz worker failed to start: {status} {reply!r}\n{self.stderr_tail()}")

    def close(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001
                self._kill()
            self.proc = None
        self._stderr.close()

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()

    def stderr_tail(self, n: int = 4000) -> str:
        self._stderr.flush()
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - n))
        return self._stderr.read().decode("utf-8", "replace")

    # ---------------------------------------------------------------- protocol
    def _read(self, n: int, deadline: float) -> bytes | None:
        fd = self.proc.stdout.fileno()
        buf = b""
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                return None  # EOF: the worker died
            buf += chunk
        return buf

    def _call(self, payload: dict, timeout_s: float):
        """("ok", reply) | ("crash", description) | ("hang", description)."""
        data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self.proc.stdin.write(len(data).to_bytes(_HEADER_SIZE, "little") + data)
            self.proc.stdin.flush()
            deadline = time.monotonic() + timeout_s
            head = self._read(_HEADER_SIZE, deadline)
            body = None if head is None else self._read(int.from_bytes(head, "little"), deadline)
        except TimeoutError:
            self._kill()
            return "hang", f"no reply within {timeout_s:.0f} s; worker killed"
        except BrokenPipeError:
            body = None
        if body is None:
            rc = self.proc.wait()
            how = f"killed by signal {signal.Signals(-rc).name}" if rc < 0 else f"exited with status {rc}"
            return "crash", f"worker {how}"
        return "ok", pickle.loads(body)

    def run(self, payload: dict):
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        status, reply = self._call(payload, self.timeout_s)
        if status != "ok":
            detail = reply + "\n--- worker stderr (tail) ---\n" + self.stderr_tail()
            self.proc = None
            self.restarts += 1
            return status, detail
        return status, reply


def _outputs(kind: str, payload) -> list:
    """An "ok" reply's payload as a list of (value, dtype name)."""
    if kind == "ort":
        return [(a, a.dtype.name) for a in payload]
    y, grads = payload[0], (payload[2] if len(payload) > 2 else [])
    return [_pair(y)] + [_pair(g) if g is not None else (None, "none") for g in grads]


def _pair(v):
    # worker.run_torch gives (array, dtype) or ("meta" | "empty", shape, dtype).
    return (v, v[2]) if isinstance(v[0], str) else (v[0], v[1])


def judge(case: Case, worker: Worker) -> Result:
    status, reply = worker.run(case.payload)
    if status != "ok":
        return Result(status, reply)
    problem = oracle.judge(case.expect, reply, lambda p: _outputs(case.kind, p))
    return Result("pass" if problem is None else "fail", problem or "", reply)


def save_case(case: Case, result: Result, folder: Path) -> Path:
    """Writes a failing case for replay (python -m tests.fuzz.run --replay FILE)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{case.op}-{case.kind}-{result.verdict}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{id(case)}.pkl"
    with open(path, "wb") as f:
        pickle.dump({"case": case, "verdict": result.verdict, "detail": result.detail}, f)
    return path
