"""What the fuzz harness accepts as an outcome.

Every case carries an expectation:
- Ok: the op must succeed and each output must equal the float64 reference within an
  elementwise allowance (`allowed`, computed by the op's fuzz module from its documented
  tolerances). Non-finite values must match exactly: NaN where the reference is NaN and nowhere
  else, the same infinity where the reference is infinite. Finite reference values are compared
  after saturating both sides at the output type's largest finite value (a result that rounds to
  inf in float16 is as right as the reference that does).
- Error: the op must fail with a *clear* message: one that matches at least one of the listed
  patterns. Patterns come from two places: the op's own validation messages (which always name
  the op, e.g. "ai.opbridge::GroupNorm: num_groups must be > 0, got 0") and ORT's own validation
  of models and feeds, listed explicitly in ORT_CLEAR below. Anything else ("bad_alloc", a bare
  "Integer overflow" from our code, an empty message) is a failure.
- Either: both are acceptable (used only where a correct result and a clear refusal are equally
  right, e.g. a zero-size output that a runtime may or may not bother to compute).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional, Sequence

import numpy as np

# ORT's own refusals, each a clear statement of what is wrong with a model or a feed.
ORT_CLEAR = {
    # An input type the op has no kernel for (int32 X, string X, ...), checked at model load.
    "type": r"Type Error: Type '[^']+' of input parameter \([^)]*\) of operator \(\w+\) in node \([^)]*\) is invalid",
    # Inputs of different types where the op's type constraint wants one (float X, double scale).
    "type_mismatch": r"\[CustomOP type inferencing error\]: no kernel def matches node",
    "no_kernel": r"Could not find an implementation for \w+\(\d+\) node",
    # A tensor type this ORT build does not support at all (complex64 through Cast, ...).
    "unsupported_type": r"MLDataType for: tensor\(\w+\) is not currently registered or supported",
    # Node arity: too many inputs, or a required input given as "".
    "arity": r"has input size \d+ not in range \[min=\d+, max=\d+\]",
    "empty_required": r"input \d+ is marked single but has an empty string in the graph",
    # Tensor shapes whose element count overflows int64 (ORT's SafeInt, e.g. in ConstantOfShape).
    "shape_overflow": r"SafeIntOnOverflow\(\) Integer overflow",
    # Feeds that do not fit the model's declared inputs.
    "feed_type": r"Unexpected input data type\. Actual: \(tensor\(\w+\)\) , expected: \(tensor\(\w+\)\)",
    "feed_missing": r"Required inputs \(\[.*\]\) are missing from input feed",
    "feed_name": r"Invalid input name: \S+",
    "feed_rank": r"Invalid rank for input: \S+ Got: \d+ Expected: \d+",
    "feed_dims": r"Got invalid dimensions for input: \S+ for the following indices",
}


@dataclasses.dataclass
class Expected:
    """One output. ref: float64 reference (or None for a meta tensor: shape/dtype only);
    dtype: the output's dtype name; allowed: elementwise absolute allowance (broadcastable)."""

    ref: Optional[np.ndarray]
    dtype: str
    allowed: object = 0.0
    shape: Optional[tuple] = None  # checked when ref is None
    # Elements whose value is not specified (any value, NaN and inf included, is right), e.g.
    # the inverse of a matrix holding inf, or of one too ill-conditioned for the type.
    unchecked: object = False


@dataclasses.dataclass
class Ok:
    outputs: Sequence[Optional[Expected]]  # None: output not checked
    why: str = ""


@dataclasses.dataclass
class Error:
    patterns: Sequence[str]  # regexes; the message must match one (re.search)
    why: str  # which rule makes the case invalid (for the report)
    types: Sequence[str] = ()  # accepted exception type names; empty: any


@dataclasses.dataclass
class Either:
    ok: Ok
    error: Error


def finfo_max(dtype: str) -> float:
    """Largest finite value of a float dtype (inf for non-float types)."""
    if dtype == "bfloat16":
        return float.fromhex("0x1.fep127")
    if not np.issubdtype(np.dtype(dtype), np.floating):
        return np.inf
    return float(np.finfo(np.dtype(dtype)).max)


def compare(out, exp: Expected) -> Optional[str]:
    """None when `out` (a numpy array, or a ("meta", shape, dtype) triple) matches `exp`."""
    if exp.ref is None:
        # A result without values: a meta tensor, or an empty one (possibly with dims too large
        # for numpy, e.g. [2^62, 1, 0]).
        if not (isinstance(out, tuple) and out and out[0] in ("meta", "empty")):
            return f"expected a meta or empty tensor, got {type(out).__name__}"
        if tuple(out[1]) != tuple(exp.shape) or out[2] != exp.dtype:
            return f"{out[0]} result has shape {out[1]} dtype {out[2]}, expected {exp.shape} {exp.dtype}"
        return None
    if isinstance(out, tuple):
        return f"expected values, got {out[0]!r}"
    out = np.asarray(out)
    if out.shape != exp.ref.shape:
        return f"shape {out.shape}, expected {exp.ref.shape}"
    o = out.astype(np.float64)
    r = exp.ref
    free = np.broadcast_to(np.asarray(exp.unchecked, bool), r.shape)
    if free.any():
        o = np.where(free, 0.0, o)
        r = np.where(free, 0.0, r)
    nan_o, nan_r = np.isnan(o), np.isnan(r)
    if (nan_o != nan_r).any():
        i = tuple(int(k) for k in np.argwhere(nan_o != nan_r)[0])
        return f"NaN pattern differs at {i}: got {o[i]!r}, reference {r[i]!r}"
    inf_r = np.isinf(r)
    if (o[inf_r] != r[inf_r]).any():
        i = tuple(int(k) for k in np.argwhere(inf_r & (o != r))[0])
        return f"infinity differs at {i}: got {o[i]!r}, reference {r[i]!r}"
    fin = np.isfinite(r)
    fmax = finfo_max(exp.dtype)
    err = np.abs(np.clip(o, -fmax, fmax) - np.clip(r, -fmax, fmax))
    allowed = np.broadcast_to(np.nan_to_num(np.asarray(exp.allowed, np.float64), nan=np.inf), r.shape)
    bad = fin & ~(err <= allowed)
    if bad.any():
        i = tuple(int(k) for k in np.argwhere(bad)[0])
        worst = float(np.max(np.where(fin, err / np.maximum(allowed, 1e-300), 0)))
        return (f"value differs at {i}: got {o[i]!r}, reference {r[i]!r}, |diff| {err[i]:.3g} > allowed "
                f"{allowed[i]:.3g} ({int(bad.sum())} of {r.size} elements; worst diff/allowed {worst:.3g})")
    return None


def error_is_clear(err: Error, exc_type: str, message: str) -> bool:
    if err.types and exc_type not in err.types:
        return False
    return any(re.search(p, message) for p in err.patterns)


def _judge_ok(ok: Ok, outputs) -> Optional[str]:
    if len(outputs) < len(ok.outputs):
        return f"{len(outputs)} outputs, expected {len(ok.outputs)}"
    for k, (out, exp) in enumerate(zip(outputs, ok.outputs)):
        if exp is None:
            continue
        if exp.dtype != out[1]:
            return f"output {k}: dtype {out[1]}, expected {exp.dtype}"
        problem = compare(out[0], exp)
        if problem:
            return f"output {k}: {problem}"
    return None


def judge(expect, reply, normalize) -> Optional[str]:
    """None when the worker's reply is an acceptable outcome. `normalize` turns an "ok" reply's
    payload into a list of (value, dtype name) pairs."""
    if reply[0] == "ok":
        ok = expect.ok if isinstance(expect, Either) else expect
        if isinstance(ok, Error):
            return f"accepted an invalid case ({ok.why}); expected an error matching {list(ok.patterns)}"
        return _judge_ok(ok, normalize(reply[1]))
    _, exc_type, message = reply
    err = expect.error if isinstance(expect, Either) else expect
    if isinstance(err, Ok):
        return f"unexpected error (case is valid: {err.why or 'all checks pass'}): {exc_type}: {message}"
    if not error_is_clear(err, exc_type, message):
        return (f"unclear or unexpected error for an invalid case ({err.why}): {exc_type}: {message!r}; "
                f"accepted: {list(err.types) or 'any type'} matching {list(err.patterns)}")
    return None
