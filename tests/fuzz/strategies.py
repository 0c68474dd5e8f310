"""Hypothesis strategies shared by the per-op fuzz modules.

Hypothesis chooses the structure of a case (types, shapes, attributes, layouts, which values are
special); the values of large arrays come from a numpy generator seeded by a drawn integer, which
is fast and exactly reproducible from the case.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from onnx import TensorProto

INT64_MAX = 2**63 - 1

# Every tensor element type ONNX defines, by name. `np` is the numpy type a feed can have
# (None: produced inside the model by Cast from a float32 input).
ONNX_TYPES = {
    "float32": (TensorProto.FLOAT, np.float32),
    "float64": (TensorProto.DOUBLE, np.float64),
    "float16": (TensorProto.FLOAT16, np.float16),
    "bfloat16": (TensorProto.BFLOAT16, None),
    "int8": (TensorProto.INT8, np.int8),
    "int16": (TensorProto.INT16, np.int16),
    "int32": (TensorProto.INT32, np.int32),
    "int64": (TensorProto.INT64, np.int64),
    "uint8": (TensorProto.UINT8, np.uint8),
    "uint16": (TensorProto.UINT16, np.uint16),
    "uint32": (TensorProto.UINT32, np.uint32),
    "uint64": (TensorProto.UINT64, np.uint64),
    "bool": (TensorProto.BOOL, np.bool_),
    "string": (TensorProto.STRING, np.object_),
    "complex64": (TensorProto.COMPLEX64, None),
    "complex128": (TensorProto.COMPLEX128, None),
    "float8e4m3fn": (TensorProto.FLOAT8E4M3FN, None),
    "float8e4m3fnuz": (TensorProto.FLOAT8E4M3FNUZ, None),
    "float8e5m2": (TensorProto.FLOAT8E5M2, None),
    "float8e5m2fnuz": (TensorProto.FLOAT8E5M2FNUZ, None),
    "uint4": (TensorProto.UINT4, None),
    "int4": (TensorProto.INT4, None),
    "float4e2m1": (TensorProto.FLOAT4E2M1, None),
}

FLOAT_TYPES = ("float32", "float64", "float16", "bfloat16")
TORCH_BAD_TYPES = ("int8", "int32", "int64", "uint8", "bool", "complex64")


def onnx_type(name: str) -> int:
    return ONNX_TYPES[name][0]


def seeds():
    return st.integers(0, 2**32 - 1)


def weighted(*pairs):
    """One of the values, with the given integer weights: weighted((9, "a"), (1, "b")).
    (sampled_from honours repeated values; one_of would drop repeated strategies, and a drawn
    integer is biased towards its bounds.)"""
    return st.sampled_from([v for w, v in pairs for _ in range(w)])


def chance(k: int, n: int):
    """True with probability k / n."""
    return st.sampled_from([True] * k + [False] * (n - k))


@st.composite
def broken_aspects(draw, aspects):
    """Which aspects of a case to make invalid: none for about half the cases (they must give
    a correct result), one for most of the rest (each error path on its own), sometimes two (the
    error must still be one of the clear ones)."""
    n = draw(weighted((11, 0), (7, 1), (2, 2)))
    return frozenset(draw(st.permutations(sorted(aspects)))[:n])


def round_to_bf16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded (to nearest even) to bfloat16, returned as float32: exactly
    representable, so a Cast to bfloat16 in the model is exact whatever its rounding mode."""
    a = np.asarray(a, np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(a), a, out)


def as_dtype(values: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values in the numpy representation of a float dtype (bfloat16: float32 holding
    bfloat16 values). Values beyond the type's range become infinities, as a cast does."""
    values = np.asarray(values)
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "bfloat16":
            return round_to_bf16(values.astype(np.float32))
        return values.astype(np.dtype(dtype))


# Largest magnitude the fuzzer puts in data of each float type, and the range of the random
# scale. The upper limits keep float32/bfloat16 group statistics, which are accumulated in float
# (like torch's), clear of overflow: |x - mean|^2 summed over a block must stay < 3.4e38 (see
# group_norm.h, "Accuracy"). float16 data may use its whole range: it is accumulated in float.
DATA_SCALE = {
    "float64": (1e-30, 1e30),
    "float32": (1e-15, 1e15),
    "bfloat16": (1e-15, 1e15),
    "float16": (1e-3, 1e3),
}


@st.composite
def float_values(draw, dtype: str):
    """(scale, offset) for data offset + scale * N(0, 1) of a float dtype: usually modest, some-
    times extreme in scale or in offset relative to scale."""
    lo, hi = DATA_SCALE[dtype]
    mode = draw(weighted((5, "modest"), (1, "wide"), (1, "offset")))
    if mode == "modest":
        scale = 10 ** draw(st.floats(-2, 2))
        offset = draw(st.sampled_from([0.0, 1.0, -3.0, 10.0])) * scale
    elif mode == "wide":
        scale = 10 ** draw(st.floats(np.log10(lo), np.log10(hi)))
        offset = draw(st.sampled_from([0.0, 2.0, -5.0])) * scale
    else:
        # Large common offset relative to the spread (mean 1e6, unit variance and the like):
        # the one-pass E[x^2] - E[x]^2 formula loses everything here. Bounded so that the data
        # still varies in the type's precision (ratio < 2^(mantissa bits)).
        max_ratio = {"float64": 1e10, "float32": 1e6, "float16": 3e2, "bfloat16": 3e1}[dtype]
        scale = 10 ** draw(st.floats(-1, 1))
        offset = draw(st.sampled_from([1.0, -1.0])) * scale * 10 ** draw(st.floats(1, np.log10(max_ratio)))
        if dtype == "float16":
            offset = float(np.clip(offset, -6e4, 6e4))
    return scale, offset


def inject_specials(rng: np.random.Generator, a: np.ndarray, count: int) -> np.ndarray:
    """a copy of `a` with `count` elements replaced by NaN, +inf or -inf."""
    a = a.copy()
    if a.size == 0 or count == 0:
        return a
    flat = a.reshape(-1)
    idx = rng.choice(flat.size, size=min(count, flat.size), replace=False)
    flat[idx] = rng.choice([np.nan, np.inf, -np.inf], size=idx.size)
    return a


def layouts(shape):
    """Torch memory layouts for a tensor of `shape` (see worker.make_tensor)."""
    rank = len(shape)
    options = [st.just("contiguous")]
    if rank >= 2:
        options.append(st.permutations(range(rank)).map(lambda p: ("permute", tuple(p))))
        options.append(st.tuples(st.just("slice"), st.integers(0, rank - 1), st.integers(2, 3)))
    if rank in (4, 5):
        options.append(st.just("channels_last"))
    expandable = [d for d in range(rank) if shape[d] > 1]
    if expandable:
        options.append(st.tuples(st.just("expand"), st.sampled_from(expandable)))
    return st.one_of(*options)


def left_to_right_overflows(shape) -> bool:
    """Whether a left-to-right product of `shape` overflows int64 before it ends (ORT's and
    torch's element counts are computed that way, with overflow checks)."""
    p = 1
    for d in shape:
        p *= d
        if p > INT64_MAX:
            return True
    return False


def feed_array(values, type_name):
    """A feed of ONNX type `type_name` holding `values` (float64) where numpy has the type."""
    np_type = ONNX_TYPES[type_name][1]
    if type_name == "string":
        return np.asarray(values).astype(str).astype(object)
    with np.errstate(invalid="ignore", over="ignore"):
        if np.issubdtype(np_type, np.integer) or np_type is np.bool_:
            return np.nan_to_num(values, nan=0, posinf=1, neginf=-1).clip(-100, 100).astype(np_type)
        return values.astype(np_type)


def tensor_spec(data, dtype, layout="contiguous", device="cpu", requires_grad=False):
    return {"data": data, "dtype": dtype, "layout": layout, "device": device, "requires_grad": requires_grad}
