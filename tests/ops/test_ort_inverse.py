"""Inverse's on_singular ("raise" | "nan") in the CPU kernel (opbridge._core, every instruction-set
variant) and in the ORT op ai.opbridge::Inverse, and the op's OpSchemas (version 1 without the
attribute, version 2 with it).

Torch-free (numpy, onnx, onnxruntime): scripts/ort_matrix.sh runs it on every ONNX Runtime of
the matrix. References are float64 numpy (LAPACK), computed item by item.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import opbridge
import opbridge.onnx
from helpers import reference
from helpers.onnx_models import IR_VERSION, single_node_model
from test_inverse import ISAS, SINGULAR_KINDS, assert_inverse_close, make_singular, needs_isa, random_matrices

DTYPES = (np.float32, np.float64)
# Every kernel family: closed forms (1, 2), the unrolled fixed sizes (3..8, AVX2 column kernels
# from 5), one panel (9..16), several panels (17, 64); the AVX-512 kernel (n >= 128) has a test
# of its own below.
SIZES = (1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 64)


def _core():
    from opbridge import _core

    return _core


def batch_with_singular(rng, kind, n, dtype, bad, size):
    """`size` random invertible matrices, those at indices `bad` replaced by singular ones."""
    x = random_matrices(rng, (size,), n, dtype)
    for b in bad:
        x[b] = make_singular(rng, kind if n > 1 else "zero_row", n, dtype)
    return x


def assert_nan_exactly_at(y, x, bad):
    """The matrices at `bad` are all NaN; every other one is x's inverse (float64 reference)."""
    assert y.shape == x.shape and y.dtype == x.dtype
    flat_y = y.reshape((-1,) + y.shape[-2:])
    flat_x = x.reshape((-1,) + x.shape[-2:])
    bad = sorted(set(bad))
    good = [b for b in range(flat_x.shape[0]) if b not in bad]
    for b in bad:
        assert np.isnan(flat_y[b]).all(), f"matrix {b} is singular: its output must be all NaN, got {flat_y[b]}"
    assert np.isfinite(flat_y[good]).all(), "a non-singular matrix got a non-finite inverse"
    assert_inverse_close(flat_y[good], flat_x[good])


# ---- the kernel (opbridge._core) ---------------------------------------------------------------


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", SINGULAR_KINDS)
def test_core_nan_mode_marks_only_singular_matrices(rng, isa, dtype, n, kind):
    # Singular matrices first, in the middle (inside a pair the 2-matrix kernels invert
    # together, and next to another) and last.
    needs_isa(isa)
    if n == 1 and kind != "zero_row":
        pytest.skip("a 1 x 1 matrix is singular only when zero")
    bad = (0, 4, 5, 10)
    x = batch_with_singular(rng, kind, n, dtype, bad, size=11)
    assert_nan_exactly_at(_core().inverse(x, isa=isa, on_singular="nan"), x, bad)
    # "raise" (explicit or default) still names the first one.
    for kwargs in ({}, {"on_singular": "raise"}):
        with pytest.raises(RuntimeError, match=r"matrix 0 of the batch is singular"):
            _core().inverse(x, isa=isa, **kwargs)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_core_nan_mode_large_matrices(rng, isa, dtype):
    # n = 130: the AVX-512 variant's own kernel (n >= 128), with a partial last panel.
    needs_isa(isa)
    n, bad = 130, (1, 2)
    x = random_matrices(rng, (4,), n, dtype, cond=None)
    for b in bad:
        x[b] = make_singular(rng, "equal_rows" if b == 1 else "zero_col", n, dtype)
    assert_nan_exactly_at(_core().inverse(x, isa=isa, on_singular="nan"), x, bad)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n", (3, 8, 40))
def test_core_nan_mode_all_or_none_singular(rng, isa, n):
    needs_isa(isa)
    x = random_matrices(rng, (2, 3), n, np.float64)
    assert_nan_exactly_at(_core().inverse(x, isa=isa, on_singular="nan"), x, [])
    s = np.stack([make_singular(rng, "equal_rows", n, np.float64) for _ in range(4)])
    assert np.isnan(_core().inverse(s, isa=isa, on_singular="nan")).all()


def test_core_nan_mode_keeps_nan_inputs_apart(rng):
    # A NaN input gives NaN (as in "raise" mode), a singular one NaN, the rest their inverses.
    x = random_matrices(rng, (4,), 5, np.float64)
    x[1, 2, 3] = np.nan
    x[3] = make_singular(rng, "zero_col", 5, np.float64)
    y = _core().inverse(x, on_singular="nan")
    assert np.isnan(y[1]).any() and np.isnan(y[3]).all()
    assert_inverse_close(y[[0, 2]], x[[0, 2]])


@pytest.mark.parametrize("value", ["NaN", "ignore", "", "raise "])
def test_core_rejects_unknown_on_singular(value):
    with pytest.raises(ValueError, match=rf"on_singular must be 'raise' or 'nan', got '{value}'"):
        _core().inverse(np.eye(3), on_singular=value)


# ---- the ORT op ---------------------------------------------------------------------------------


def _session(dtype, on_singular=None, threads=2, name="inv"):
    attrs = {} if on_singular is None else {"on_singular": on_singular}
    model = single_node_model("Inverse", opbridge.DOMAIN, [("X", dtype, None)], attrs,
                              domain_version=1 if on_singular is None else 2)
    model.graph.node[0].name = name
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return opbridge.InferenceSession(model, so)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("n", SIZES + (130,))
@pytest.mark.parametrize("threads", (1, 2))
def test_ort_nan_mode_matches_reference(rng, dtype, n, threads):
    bad = (1, 6)
    x = batch_with_singular(rng, "equal_rows", n, dtype, bad, size=8).reshape(2, 4, n, n)
    y = _session(dtype, "nan", threads).run(None, {"X": x})[0]
    assert_nan_exactly_at(y, x, bad)


@pytest.mark.parametrize("threads", (1, 2))
def test_ort_nan_mode_large_batch_over_threads(rng, threads):
    """Thousands of small matrices split into tasks over ORT's pool, singular ones scattered
    (some in the same task, some at task edges): exactly those become NaN."""
    size = 4096
    bad = sorted(set(rng.choice(size, 200, replace=False).tolist()) | {0, 1, size - 1})
    x = batch_with_singular(rng, "scaled_row", 3, np.float32, bad, size)
    y = _session(np.float32, "nan", threads).run(None, {"X": x})[0]
    assert_nan_exactly_at(y, x, bad)


@pytest.mark.parametrize("on_singular", [None, "raise"])
def test_ort_raise_mode_names_first_singular_matrix(rng, on_singular):
    x = batch_with_singular(rng, "zero_row", 4, np.float64, (3, 5), size=7)
    sess = _session(np.float64, on_singular)
    with pytest.raises(Exception, match=r"ai.opbridge::Inverse \(node 'inv'\): matrix 3 of the batch is singular"):
        sess.run(None, {"X": x})
    good = random_matrices(rng, (3,), 4, np.float64)
    assert_inverse_close(sess.run(None, {"X": good})[0], good)


@pytest.mark.parametrize("value", ["NaN", "ignore", ""])
def test_ort_unknown_on_singular_fails_session_creation(value):
    # The same message core as torch and _core, with the node and op in front.
    with pytest.raises(Exception, match=rf"ai.opbridge::Inverse \(node 'bad_inv'\): on_singular must be 'raise' "
                                        rf"or 'nan', got '{value}'"):
        _session(np.float32, value, name="bad_inv")


def test_ort_on_singular_of_another_type_fails_session_creation():
    model = single_node_model("Inverse", opbridge.DOMAIN, [("X", np.float32, None)], {"on_singular": 1},
                              domain_version=2)
    model.graph.node[0].name = "inv"
    with pytest.raises(Exception, match=r"ai.opbridge::Inverse \(node 'inv'\): attribute 'on_singular' must be a "
                                        r"string, got an int"):
        opbridge.InferenceSession(model)


def _kalman_gain_model(dtype, m, n):
    """K = P H^T (H P H^T + R)^-1 for a batch of tracks: P (B, n, n), R (B, m, m), H (m, n), Ht = H^T."""
    t = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    # H^T is an input of its own: ORT 1.17 fuses Transpose + MatMul into com.microsoft::FusedMatMul,
    # which it has for float32 only.
    nodes = [
        helper.make_node("MatMul", ["P", "Ht"], ["PHt"]),
        helper.make_node("MatMul", ["H", "PHt"], ["HPHt"]),
        helper.make_node("Add", ["HPHt", "R"], ["S"]),
        helper.make_node("Inverse", ["S"], ["Sinv"], domain=opbridge.DOMAIN, name="innovation_inverse",
                         on_singular="nan"),
        helper.make_node("MatMul", ["PHt", "Sinv"], ["K"]),
    ]
    graph = helper.make_graph(
        nodes, "kalman_gain",
        [helper.make_tensor_value_info("P", t, ["B", n, n]), helper.make_tensor_value_info("R", t, ["B", m, m]),
         helper.make_tensor_value_info("H", t, [m, n]), helper.make_tensor_value_info("Ht", t, [n, m])],
        [helper.make_tensor_value_info("K", t, ["B", n, m])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(opbridge.DOMAIN, 2)],
                             ir_version=IR_VERSION)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_ort_batched_kalman_gain_with_one_degenerate_track(rng, dtype):
    """One Kalman update per track: the innovation covariance S of track 3 is singular (no
    uncertainty, no measurement noise). That track's gain is NaN; every other track's matches
    the float64 reference -- with on_singular="raise" the whole batch would fail."""
    tracks, n, m = 9, 4, 2
    a = rng.standard_normal((tracks, n, n))
    p = a @ a.transpose(0, 2, 1) + 0.1 * np.eye(n)  # symmetric positive definite covariances
    r = np.stack([np.diag(rng.uniform(0.05, 0.5, m)) for _ in range(tracks)])
    h = rng.standard_normal((m, n))
    p[3] = 0.0
    r[3] = 0.0
    model = _kalman_gain_model(dtype, m, n)
    onnx.checker.check_model(model, full_check=True)
    sess = opbridge.InferenceSession(model)
    k = sess.run(None, {"P": p.astype(dtype), "R": r.astype(dtype), "H": h.astype(dtype),
                        "Ht": np.ascontiguousarray(h.T).astype(dtype)})[0]
    assert np.isnan(k[3]).all()
    p64, r64, h64 = (v.astype(dtype).astype(np.float64) for v in (p, r, h))
    good = [i for i in range(tracks) if i != 3]
    s = h64 @ p64[good] @ h64.T + r64[good]
    expected = p64[good] @ h64.T @ reference.inverse(s)
    tol = 2e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(k[good], expected, rtol=tol, atol=tol * np.abs(expected).max())


# ---- the OpSchemas ------------------------------------------------------------------------------


def test_schema_version_2_adds_on_singular():
    v1 = onnx.defs.get_schema("Inverse", 1, opbridge.DOMAIN)
    v2 = onnx.defs.get_schema("Inverse", 2, opbridge.DOMAIN)
    assert v1.since_version == 1 and "on_singular" not in v1.attributes
    assert v2.since_version == 2
    attr = v2.attributes["on_singular"]
    assert not attr.required and attr.default_value.s == b"raise"


@pytest.mark.parametrize("version,attrs,ok", [
    (1, {}, True), (2, {}, True), (2, {"on_singular": "nan"}, True), (2, {"on_singular": "raise"}, True),
    (1, {"on_singular": "nan"}, False),
], ids=["v1", "v2", "v2-nan", "v2-raise", "v1-nan"])
def test_checker_knows_on_singular_from_version_2(version, attrs, ok):
    model = single_node_model("Inverse", opbridge.DOMAIN, [("X", np.float32, ["B", 3, 3])], attrs,
                              domain_version=version)
    model.graph.output[0].type.tensor_type.shape.dim.extend(model.graph.input[0].type.tensor_type.shape.dim)
    if ok:
        onnx.checker.check_model(model, full_check=True)
    else:
        with pytest.raises(onnx.checker.ValidationError, match="on_singular"):
            onnx.checker.check_model(model, full_check=True)
