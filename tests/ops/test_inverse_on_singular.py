"""opbridge.ops.inverse(x, on_singular="raise" | "nan") in torch (forward, autograd, fake kernel)
and its export (ai.opbridge::Inverse's on_singular attribute; com.microsoft::Inverse), checked
against float64 numpy references and ONNX Runtime. The torch-free half (kernel variants, ORT op,
schemas) is tests/ops/test_ort_inverse.py."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import opbridge
from helpers import reference
from test_inverse import make_singular, random_matrices
from test_ort_inverse import assert_nan_exactly_at, batch_with_singular

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch")
import opbridge.onnx  # noqa: E402
import opbridge.ops  # noqa: E402

DTYPES = (np.float32, np.float64)
EXPORTERS = pytest.mark.parametrize("dynamo", (True, False), ids=["dynamo", "torchscript"])


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


# ---- torch op -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("n", (1, 2, 3, 5, 8, 12, 64))
def test_nan_mode_matches_reference(rng, two_threads, dtype, n):
    bad = (0, 3, 4)
    x = batch_with_singular(rng, "equal_rows", n, dtype, bad, size=6)
    y = opbridge.ops.inverse(torch.from_numpy(x), on_singular="nan")
    assert_nan_exactly_at(y.numpy(), x, bad)
    # Positional and through torch.ops too.
    y2 = torch.ops.opbridge.inverse(torch.from_numpy(x), "nan")
    np.testing.assert_array_equal(y.numpy(), y2.numpy())


@pytest.mark.parametrize("on_singular", ["raise", None])
def test_raise_mode_is_the_default(rng, on_singular):
    x = torch.from_numpy(batch_with_singular(rng, "zero_col", 4, np.float32, (2,), size=5))
    kwargs = {} if on_singular is None else {"on_singular": on_singular}
    with pytest.raises(torch.linalg.LinAlgError, match=r"opbridge::inverse: matrix 2 of the batch is singular"):
        opbridge.ops.inverse(x, **kwargs)


@pytest.mark.parametrize("value", ["NaN", "ignore", "", "zero"])
def test_unknown_on_singular_is_a_value_error(value):
    msg = rf"opbridge::inverse: on_singular must be 'raise' or 'nan', got '{value}'"
    with pytest.raises(ValueError, match=msg):
        opbridge.ops.inverse(torch.eye(3), on_singular=value)
    # The fake kernel (torch.compile / torch.export) says the same.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), pytest.raises(ValueError, match=msg):
        opbridge.ops.inverse(torch.empty(2, 3, 3), on_singular=value)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_gradient_is_nan_for_the_singular_item_only(rng, dtype):
    """d/dA of sum(G * A^-1) is -A^-T G A^-T: NaN for the singular item, the float64 reference for
    the others."""
    n, bad = 4, 2
    x = batch_with_singular(rng, "scaled_row", n, dtype, (bad,), size=5)
    g = rng.standard_normal(x.shape).astype(dtype)
    xt = torch.from_numpy(x).requires_grad_()
    y = opbridge.ops.inverse(xt, on_singular="nan")
    y.backward(torch.from_numpy(g))
    grad = xt.grad.numpy()
    assert np.isnan(grad[bad]).all()
    good = [i for i in range(5) if i != bad]
    inv = reference.inverse(x[good])
    inv_t = inv.transpose(0, 2, 1)
    expected = -(inv_t @ g[good].astype(np.float64) @ inv_t)
    tol = 1e-3 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(grad[good], expected, rtol=tol, atol=tol * np.abs(expected).max())


def test_nan_mode_gradcheck_and_opcheck(rng):
    x = torch.from_numpy(random_matrices(rng, (2,), 3, np.float64)).requires_grad_()

    def fn(a):
        return opbridge.ops.inverse(a, on_singular="nan")

    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))
    torch.library.opcheck(torch.ops.opbridge.inverse.default, (x.detach().float(),), {"on_singular": "nan"})


def test_nan_mode_under_torch_compile(rng):
    x = batch_with_singular(rng, "zero_row", 3, np.float32, (1,), size=3)

    @torch.compile(fullgraph=True, backend="eager")
    def fn(a):
        return opbridge.ops.inverse(a, on_singular="nan") * 2.0

    assert_nan_exactly_at(fn(torch.from_numpy(x)).numpy() / 2.0, x, [1])


# ---- a batched Kalman update --------------------------------------------------------------------


class KalmanUpdate(torch.nn.Module):
    """The measurement update of one Kalman filter per track (state n, measurement m):
    S = H P H^T + R, K = P H^T S^-1, x' = x + K (z - H x), P' = (I - K H) P.
    A track whose S is singular gets NaN state instead of failing every track."""

    def __init__(self, h: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("h", h)

    def forward(self, x, p, z, r):
        h = self.h
        ht = h.transpose(0, 1)
        pht = p @ ht
        s = h @ pht + r
        k = pht @ opbridge.ops.inverse(s, on_singular="nan")
        x_new = x + (k @ (z - x @ ht).unsqueeze(-1)).squeeze(-1)
        p_new = p - k @ h @ p
        return x_new, p_new


def _kalman_inputs(rng, tracks, n, m, dtype, degenerate):
    a = rng.standard_normal((tracks, n, n))
    p = a @ a.transpose(0, 2, 1) + 0.1 * np.eye(n)
    r = np.stack([np.diag(rng.uniform(0.05, 0.5, m)) for _ in range(tracks)])
    for i in degenerate:  # no uncertainty and a noiseless sensor: S = 0
        p[i] = 0.0
        r[i] = 0.0
    x = rng.standard_normal((tracks, n))
    z = rng.standard_normal((tracks, m))
    return tuple(v.astype(dtype) for v in (x, p, z, r))


def _kalman_reference(h, x, p, z, r):
    """float64, one track at a time."""
    h, x, p, z, r = (np.asarray(v, np.float64) for v in (h, x, p, z, r))
    xs, ps = [], []
    for i in range(x.shape[0]):
        s = h @ p[i] @ h.T + r[i]
        k = p[i] @ h.T @ np.linalg.inv(s)
        xs.append(x[i] + k @ (z[i] - h @ x[i]))
        ps.append(p[i] - k @ h @ p[i])
    return np.stack(xs), np.stack(ps)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_batched_kalman_update_with_one_degenerate_track(rng, dtype):
    tracks, n, m, bad = 16, 4, 2, 11
    h = rng.standard_normal((m, n)).astype(dtype)
    model = KalmanUpdate(torch.from_numpy(h)).eval()
    x, p, z, r = _kalman_inputs(rng, tracks, n, m, dtype, [bad])
    x_new, p_new = (t.numpy() for t in model(*map(torch.from_numpy, (x, p, z, r))))
    assert np.isnan(x_new[bad]).all() and np.isnan(p_new[bad]).all()
    good = [i for i in range(tracks) if i != bad]
    ref_x, ref_p = _kalman_reference(h, x[good], p[good], z[good], r[good])
    tol = 2e-3 if dtype == np.float32 else 1e-9
    np.testing.assert_allclose(x_new[good], ref_x, rtol=tol, atol=tol * np.abs(ref_x).max())
    np.testing.assert_allclose(p_new[good], ref_p, rtol=tol, atol=tol * np.abs(ref_p).max())
    # With "raise" the one degenerate track fails them all.
    s = torch.from_numpy(h @ p @ h.T + r)
    with pytest.raises(torch.linalg.LinAlgError, match="matrix 11 of the batch is singular"):
        opbridge.ops.inverse(s)


@EXPORTERS
def test_kalman_update_exports_and_runs_in_ort(rng, dynamo):
    """Exported with on_singular="nan": ORT gives the degenerate tracks NaN and the others torch's
    result, for another number of tracks than the example's."""
    tracks, n, m = 5, 4, 2
    h = rng.standard_normal((m, n)).astype(np.float32)
    model = KalmanUpdate(torch.from_numpy(h)).eval()
    example = tuple(map(torch.from_numpy, _kalman_inputs(rng, 3, n, m, np.float32, [])))
    proto = opbridge.onnx.export(model, example, dynamo=dynamo)
    inverses = [nd for nd in proto.graph.node if nd.op_type == "Inverse"]
    assert [(nd.domain, [(a.name, a.s) for a in nd.attribute]) for nd in inverses] == \
        [(opbridge.DOMAIN, [("on_singular", b"nan")])]
    assert {o.domain: o.version for o in proto.opset_import}[opbridge.DOMAIN] == 2
    onnx.checker.check_model(proto, full_check=True)
    sess = opbridge.InferenceSession(proto)
    feeds_np = _kalman_inputs(rng, tracks, n, m, np.float32, [0, 3])
    got = sess.run(None, {i.name: v for i, v in zip(sess.get_inputs(), feeds_np)})
    want = model(*map(torch.from_numpy, feeds_np))
    for g, w in zip(got, want):
        w = w.detach().numpy()
        assert np.isnan(g[[0, 3]]).all()
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * np.nanmax(np.abs(w)))  # NaN where torch has NaN


# ---- export -------------------------------------------------------------------------------------


class TwoInverses(torch.nn.Module):
    def __init__(self, first: str, second: str) -> None:
        super().__init__()
        self.first, self.second = first, second

    def forward(self, x):
        return opbridge.ops.inverse(x, on_singular=self.first) - 2.0 * opbridge.ops.inverse(
            x.transpose(-2, -1), on_singular=self.second)


def _inverse_nodes(proto):
    return sorted((n.domain, tuple((a.name, a.s.decode()) for a in n.attribute))
                  for n in proto.graph.node if n.op_type == "Inverse")


@EXPORTERS
@pytest.mark.parametrize("first,second,version", [("raise", "raise", 1), ("nan", "raise", 2), ("nan", "nan", 2)])
def test_custom_lowering_writes_the_attribute_only_when_not_default(rng, dynamo, first, second, version):
    proto = opbridge.onnx.export(TwoInverses(first, second).eval(), (torch.randn(2, 3, 3),), dynamo=dynamo)
    expected = sorted((opbridge.DOMAIN, (("on_singular", "nan"),) if v == "nan" else ()) for v in (first, second))
    assert _inverse_nodes(proto) == expected
    # Only a node that uses on_singular needs version 2; without it the model stays version 1.
    assert {o.domain: o.version for o in proto.opset_import}[opbridge.DOMAIN] == version
    onnx.checker.check_model(proto, full_check=True)
    # A zero row: x and its transpose (the second inverse's input) are both found singular.
    x = batch_with_singular(rng, "zero_row", 3, np.float32, (1,), size=3)
    sess = opbridge.InferenceSession(proto)
    if first == second == "nan":
        got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
        want = TwoInverses(first, second)(torch.from_numpy(x)).numpy()
        assert np.isnan(got[1]).all()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.nanmax(np.abs(want)))
    else:
        with pytest.raises(Exception, match="matrix 1 of the batch is singular"):
            sess.run(None, {sess.get_inputs()[0].name: x})


@EXPORTERS
def test_nan_needs_version_2_of_the_domain(dynamo):
    # (The dynamo exporter wraps the ValueError in its ConversionError, message included.)
    with pytest.raises((ValueError, RuntimeError),
                       match=r"custom_opsets asks for ai.opbridge version 1, but the Inverse node .* needs version 2"):
        opbridge.onnx.export(TwoInverses("nan", "raise").eval(), (torch.randn(2, 3, 3),), dynamo=dynamo,
                             custom_opsets={opbridge.DOMAIN: 1})
    proto = opbridge.onnx.export(TwoInverses("nan", "raise").eval(), (torch.randn(2, 3, 3),), dynamo=dynamo,
                                 custom_opsets={opbridge.DOMAIN: 3})
    assert {o.domain: o.version for o in proto.opset_import}[opbridge.DOMAIN] == 3


def _export_recording(model, dynamo, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        proto = opbridge.onnx.export(model, (torch.randn(2, 3, 3),), dynamo=dynamo, **kwargs)
    return proto, [str(w.message) for w in caught if "com.microsoft::Inverse" in str(w.message)]


@EXPORTERS
def test_standard_lowering_of_raise_warns_once(rng, dynamo):
    proto, messages = _export_recording(TwoInverses("raise", "raise").eval(), dynamo, lowering="standard")
    assert len(messages) == 1, messages  # two nodes, one warning
    assert "cannot raise" in messages[0] and "on_singular='nan'" in messages[0]
    assert {d for d, _ in _inverse_nodes(proto)} == {"com.microsoft"}
    # Each export says it again (its own model).
    _, again = _export_recording(TwoInverses("raise", "nan").eval(), dynamo, lowering={"inverse": "standard"})
    assert len(again) == 1


@EXPORTERS
def test_standard_lowering_of_nan_is_silent_and_runs_on_stock_ort(rng, dynamo):
    proto, messages = _export_recording(TwoInverses("nan", "nan").eval(), dynamo, lowering="standard")
    assert messages == []
    assert {d for d, _ in _inverse_nodes(proto)} == {"com.microsoft"}
    assert all(attrs == () for _, attrs in _inverse_nodes(proto))
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    x = random_matrices(rng, (4,), 3, np.float32)
    got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    want = TwoInverses("nan", "nan")(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    # A singular item gives non-finite values in that item only (what com.microsoft can express).
    x[2] = make_singular(rng, "zero_row", 3, np.float32)
    got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    assert not np.isfinite(got[2]).all()
    good = [0, 1, 3]
    want = TwoInverses("nan", "nan")(torch.from_numpy(x[good])).numpy()
    np.testing.assert_allclose(got[good], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
