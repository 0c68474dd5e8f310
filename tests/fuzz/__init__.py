"""Fuzzing opbridge's ORT and torch ops: hypothesis-generated cases, each run in a long-lived
child process, judged against the float64 references of tests/helpers/reference.py.

- harness.py: the worker process protocol; a crash or hang of the worker is recorded with the
  case that caused it and the worker is restarted.
- worker.py:  the child side (runs ORT sessions and torch ops, nothing else).
- oracle.py:  what counts as a correct result and as a clear error.
- strategies.py: shared hypothesis strategies (dtypes, shapes, data, torch layouts).
- ops/<op>.py: one module per op with `ort_cases()` and `torch_cases()` strategies; discovered
  automatically (adding an op adds a file, nothing else).
- run.py: the long run, ``python -m tests.fuzz.run --cases 10000``.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The helpers package (reference.py, onnx_models.py) lives in tests/, which pytest puts on sys.path; `python -m
# tests.fuzz.run` from the repo root does not.
_TESTS = str(Path(__file__).resolve().parent.parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
