"""Inverse: the CPU kernel (opbridge._core), the ORT op ai.opbridge::Inverse, the torch op
opbridge::inverse and the export of both it and torch's own inverse.

Tests without the `torch` marker need only numpy, onnx and onnxruntime (they also run in
torch-free environments against older ONNX Runtime versions).
"""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest

import opbridge
from helpers import reference
from helpers.onnx_models import single_node_model

SIZES = (1, 2, 3, 4, 5, 8, 16, 64, 256)
BATCHES = ((), (7,), (2, 3))
DTYPES = (np.float32, np.float64)
# Every instruction-set variant of the kernels; those the CPU lacks are skipped with a reason.
ISAS = ("baseline", "avx2", "avx512")
SINGULAR_KINDS = ("zero_row", "zero_col", "equal_rows", "scaled_row")


def _core():
    from opbridge import _core

    return _core


def random_matrices(rng, batch, n, dtype, cond=10.0):
    """Dense matrices U diag(s) V^T with random orthogonal U, V and singular values s spread
    log-uniformly over [1, cond] (so the 2-norm condition number is about cond), times a random
    scale: every entry matters and partial pivoting has real choices to make. cond=None: plain
    Gaussian matrices (cheaper; invertible, conditioning left to chance)."""
    count = math.prod(batch)
    if cond is None:
        return rng.standard_normal(batch + (n, n)).astype(dtype)
    out = np.empty((count, n, n))
    for b in range(count):
        u, _ = np.linalg.qr(rng.standard_normal((n, n)))
        v, _ = np.linalg.qr(rng.standard_normal((n, n)))
        s = np.geomspace(1.0, cond, n) if n > 1 else np.array([rng.uniform(1.0, cond)])
        rng.shuffle(s)
        out[b] = (u * s) @ v.T * 10.0 ** rng.uniform(-2, 2)
    return out.reshape(batch + (n, n)).astype(dtype)


def assert_inverse_close(y, x):
    """y must be the inverse of every matrix of x: compared with the float64 inverse of x (as
    given, i.e. after rounding to x's dtype), relative to the largest entry of each inverse,
    within 4 n cond(x) eps -- the usual bound for an LU-type inverse with a modest constant."""
    assert y.shape == x.shape and y.dtype == x.dtype
    n = x.shape[-1]
    if x.size == 0:
        return
    x64 = x.astype(np.float64).reshape(-1, n, n)
    ref = reference.inverse(x64)
    got = y.astype(np.float64).reshape(-1, n, n)
    cond = np.linalg.cond(x64)
    eps = np.finfo(x.dtype).eps
    for b in range(x64.shape[0]):
        scale = np.abs(ref[b]).max()
        err = np.abs(got[b] - ref[b]).max() / scale
        tol = 4 * n * cond[b] * eps
        assert err <= tol, f"matrix {b}: relative error {err:.3g} > {tol:.3g} (n={n}, cond={cond[b]:.3g})"


def make_singular(rng, kind, n, dtype):
    """A random matrix made exactly singular in a way pivoted elimination detects exactly (a zero
    pivot): a zero row or column, a row equal to another, or a row twice another."""
    a = random_matrices(rng, (), n, np.float64, cond=None)
    i, j = (rng.choice(n, 2, replace=False) if n > 1 else (0, 0))
    if kind == "zero_row":
        a[i] = 0.0
    elif kind == "zero_col":
        a[:, i] = 0.0
    elif kind == "equal_rows":
        a[j] = a[i]
    elif kind == "scaled_row":
        a[j] = 2.0 * a[i]  # exact in binary floating point
    return a.astype(dtype)


def singular_batch(rng, kind, n, dtype, bad=(4, 6), size=7):
    """A batch of `size` matrices where those at indices `bad` are singular."""
    x = random_matrices(rng, (size,), n, dtype, cond=None)
    for b in bad:
        x[b] = make_singular(rng, kind, n, dtype)
    return x


def needs_isa(isa):
    if not _core().cpu_isa_supported(isa):
        pytest.skip(f"this CPU or build has no {isa} kernels")


# ---- the kernel through opbridge._core (no torch, no ORT) ---------------------------------------


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("batch", BATCHES, ids=str)
def test_core_matches_numpy(rng, isa, dtype, n, batch):
    needs_isa(isa)
    x = random_matrices(rng, batch, n, dtype)
    assert_inverse_close(_core().inverse(x, isa=isa), x)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("n", (2, 3, 4, 8, 16, 64))
def test_core_ill_conditioned(rng, isa, dtype, n):
    """Condition numbers near 1/sqrt(eps): invertible, but far from benign."""
    needs_isa(isa)
    cond = 1e4 if dtype == np.float32 else 1e10
    x = random_matrices(rng, (5,), n, dtype, cond=cond)
    assert_inverse_close(_core().inverse(x, isa=isa), x)


@pytest.mark.parametrize("isa", ISAS)
def test_core_hilbert(isa):
    """The 8 x 8 Hilbert matrix (cond ~ 1.5e10), whose inverse has integer entries up to 4e9."""
    needs_isa(isa)
    n = 8
    h = 1.0 / (np.arange(n)[:, None] + np.arange(n)[None, :] + 1.0)
    assert_inverse_close(_core().inverse(h, isa=isa), h)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", SINGULAR_KINDS)
def test_core_singular_names_first_singular_matrix(rng, isa, dtype, n, kind):
    needs_isa(isa)
    if n == 1 and kind != "zero_row":
        pytest.skip("a 1 x 1 matrix is singular only when zero")
    x = singular_batch(rng, kind, n, dtype)
    with pytest.raises(RuntimeError, match=r"matrix 4 of the batch is singular \(U\[\d+,\d+\] == 0\)"):
        _core().inverse(x, isa=isa)


@pytest.mark.parametrize("n", (3, 8, 37))
def test_core_avx2_agrees_with_baseline(rng, n):
    """The variants may differ only by rounding (AVX2 fuses multiply-adds)."""
    needs_isa("avx2")
    x = random_matrices(rng, (9,), n, np.float64)
    np.testing.assert_allclose(_core().inverse(x, isa="avx2"), _core().inverse(x, isa="baseline"), rtol=0,
                               atol=1e-12 * np.abs(reference.inverse(x)).max())


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("n", (128, 130, 203))
def test_core_avx512_large_matrices(rng, n, dtype):
    """From n = 128 the AVX-512 variant has a kernel of its own (16-column panels): full
    panels, a partial last panel, rows that are not a whole number of vectors."""
    needs_isa("avx512")
    x = random_matrices(rng, (3,), n, dtype)
    y = _core().inverse(x, isa="avx512")
    assert_inverse_close(y, x)
    ref = reference.inverse(x.astype(np.float64))
    np.testing.assert_allclose(y, _core().inverse(x, isa="avx2"), rtol=0,
                               atol=64 * n * np.finfo(dtype).eps * np.abs(ref).max())


def test_core_nan_gives_nan_not_singular(rng):
    for n in (3, 8, 40):
        x = random_matrices(rng, (2,), n, np.float64)
        x[1, 0, 0] = np.nan
        y = _core().inverse(x)
        assert np.isnan(y[1]).any()
        assert_inverse_close(y[:1], x[:1])


@pytest.mark.parametrize("shape", [(3, 4), (2, 5, 3), (4,), ()])
def test_core_rejects_non_square(shape):
    with pytest.raises(ValueError, match="square matrices|rank >= 2"):
        _core().inverse(np.ones(shape, np.float32))


def test_core_rejects_other_dtypes():
    with pytest.raises(TypeError, match="float32 or float64"):
        _core().inverse(np.eye(3, dtype=np.float16))


def test_core_empty():
    for shape in [(0, 3, 3), (2, 0, 0)]:
        y = _core().inverse(np.ones(shape, np.float32))
        assert y.shape == shape


# ---- the ORT op ai.opbridge::Inverse (no torch) --------------------------------------------------

_SESSIONS: dict = {}


def ort_session(dtype, rank, threads=2):
    """A session running one ai.opbridge::Inverse node on a rank-`rank` input (symbolic dims)."""
    key = (np.dtype(dtype), rank, threads)
    if key not in _SESSIONS:
        dims = [f"b{i}" for i in range(rank - 2)] + ["n", "n"] if rank >= 2 else ["n"]
        model = single_node_model("Inverse", opbridge.DOMAIN, [("X", dtype, dims)])
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        _SESSIONS[key] = opbridge.InferenceSession(model, so)
    return _SESSIONS[key]


def run_ort(x, threads=2):
    return ort_session(x.dtype, x.ndim, threads).run(None, {"X": x})[0]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("batch", BATCHES, ids=str)
def test_ort_matches_numpy(rng, dtype, n, batch):
    x = random_matrices(rng, batch, n, dtype)
    assert_inverse_close(run_ort(x), x)


@pytest.mark.parametrize("threads", (1, 2))
def test_ort_large_batch_over_threads(rng, threads):
    """Many small matrices: the batch is split into tasks over ORT's thread pool."""
    x = random_matrices(rng, (4096,), 3, np.float32)
    assert_inverse_close(run_ort(x, threads), x)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("n", (3, 8, 64))
def test_ort_ill_conditioned(rng, dtype, n):
    cond = 1e4 if dtype == np.float32 else 1e10
    x = random_matrices(rng, (5,), n, dtype, cond=cond)
    assert_inverse_close(run_ort(x), x)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("n", (1, 2, 3, 8, 64, 256))
@pytest.mark.parametrize("kind", SINGULAR_KINDS)
def test_ort_singular_is_an_error_naming_the_batch_index(rng, dtype, n, kind):
    if n == 1 and kind != "zero_row":
        pytest.skip("a 1 x 1 matrix is singular only when zero")
    x = singular_batch(rng, kind, n, dtype)
    with pytest.raises(Exception, match=r"Inverse.*matrix 4 of the batch is singular") as info:
        run_ort(x)
    # ORT's Python exceptions (Fail, RuntimeException, ...) all live in this module.
    assert type(info.value).__module__.startswith("onnxruntime")
    # The process and the session survive, and the session still works.
    good = random_matrices(rng, (2,), n, dtype)
    assert_inverse_close(run_ort(good), good)


@pytest.mark.parametrize("shape", [(3, 4), (2, 5, 3)])
def test_ort_rejects_non_square(shape):
    x = np.ones(shape, np.float32)
    with pytest.raises(Exception, match="square matrices"):
        run_ort(x)


def test_ort_rejects_rank_1():
    with pytest.raises(Exception, match="rank >= 2"):
        run_ort(np.ones(4, np.float32))


def test_ort_empty():
    for shape in [(0, 3, 3), (2, 0, 0)]:
        y = run_ort(np.ones(shape, np.float32))
        assert y.shape == shape


def test_ort_output_shape_inferred():
    # The model declares Y without a shape; the op's shape inference gives it X's (symbolic) one.
    sess = ort_session(np.float32, 3)
    out = sess.get_outputs()[0]
    assert out.shape == ["b0", "n", "n"]
    assert out.type == "tensor(float)"


# ---- the torch op -------------------------------------------------------------------------------


@pytest.fixture
def two_threads():
    """torch with 2 threads: the setting in which torch 2.13's own CPU inverse breaks for n >= ~150."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.torch
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("batch", BATCHES, ids=str)
def test_torch_matches_numpy(rng, two_threads, dtype, n, batch):
    import torch

    import opbridge.ops

    x = random_matrices(rng, batch, n, dtype)
    y = opbridge.ops.inverse(torch.from_numpy(x))
    assert_inverse_close(y.numpy(), x)


@pytest.mark.torch
def test_torch_large_matrices_many_threads(rng, two_threads):
    """A batch of 256 x 256 matrices over 2 threads: where torch.linalg.inv itself fails."""
    import torch

    import opbridge.ops

    x = random_matrices(rng, (8,), 256, np.float32)
    assert_inverse_close(opbridge.ops.inverse(torch.from_numpy(x)).numpy(), x)


@pytest.mark.torch
def test_torch_non_contiguous_input(rng):
    import torch

    import opbridge.ops

    x = random_matrices(rng, (3,), 5, np.float64)
    xt = torch.from_numpy(x).transpose(-2, -1)  # a view, not contiguous
    assert not xt.is_contiguous()
    assert_inverse_close(opbridge.ops.inverse(xt).numpy(), xt.numpy())


@pytest.mark.torch
@pytest.mark.parametrize("n", (1, 3, 8, 64))
@pytest.mark.parametrize("kind", SINGULAR_KINDS)
def test_torch_singular_raises_linalg_error(rng, n, kind):
    import torch

    import opbridge.ops

    if n == 1 and kind != "zero_row":
        pytest.skip("a 1 x 1 matrix is singular only when zero")
    x = torch.from_numpy(singular_batch(rng, kind, n, np.float32))
    with pytest.raises(torch.linalg.LinAlgError, match=r"opbridge::inverse: matrix 4 of the batch is singular"):
        opbridge.ops.inverse(x)


@pytest.mark.torch
def test_torch_rejects_bad_input():
    import torch

    import opbridge.ops

    with pytest.raises(ValueError, match="square matrices"):
        opbridge.ops.inverse(torch.ones(3, 4))
    with pytest.raises(ValueError, match="rank >= 2"):
        opbridge.ops.inverse(torch.ones(4))
    with pytest.raises(TypeError, match="float32 or float64"):
        opbridge.ops.inverse(torch.ones(3, 3, dtype=torch.int64))


@pytest.mark.torch
@pytest.mark.parametrize("n", (1, 2, 3, 6))
def test_torch_gradcheck(rng, n):
    import torch

    import opbridge.ops

    x = torch.from_numpy(random_matrices(rng, (2,), n, np.float64)).requires_grad_()
    assert torch.autograd.gradcheck(opbridge.ops.inverse, (x,))
    assert torch.autograd.gradgradcheck(opbridge.ops.inverse, (x,))


@pytest.mark.torch
def test_torch_opcheck(rng):
    import torch

    import opbridge.ops  # noqa: F401

    for batch, n in (((), 3), ((2,), 5), ((2, 3), 1)):
        x = torch.from_numpy(random_matrices(rng, batch, n, np.float32))
        torch.library.opcheck(torch.ops.opbridge.inverse.default, (x,))


# ---- export -------------------------------------------------------------------------------------

EXPORTERS = pytest.mark.parametrize("dynamo", (True, False), ids=["dynamo", "torchscript"])


def _nodes(proto):
    return [(n.domain, n.op_type) for n in proto.graph.node]


def _imports(proto):
    return {o.domain: o.version for o in proto.opset_import}


def _torch_models():
    import torch

    import opbridge.ops

    class OrtNoteExample(torch.nn.Module):
        # The model of ONNX Runtime's "Export of Custom Ops" note.
        def forward(self, x):
            return torch.inverse(x) + x

    class Both(torch.nn.Module):
        # torch's inverse and ours side by side (on different inputs, so that the exporter's
        # optimizer cannot merge them when both lower to the same node).
        def forward(self, x):
            return torch.linalg.inv(x) - 2.0 * opbridge.ops.inverse(x.transpose(-2, -1))

    return OrtNoteExample, Both


@pytest.mark.torch
@EXPORTERS
def test_ort_note_example_runs_on_stock_onnxruntime(rng, dynamo):
    """torch.inverse(x) + x exports (by default) to com.microsoft::Inverse, which a plain
    onnxruntime.InferenceSession runs without opbridge's library, matching PyTorch within the
    note's tolerances."""
    import torch

    import opbridge.onnx

    note, _ = _torch_models()
    model = note().eval()
    proto = opbridge.onnx.export(model, (torch.randn(2, 3, 3),), dynamo=dynamo)
    assert ("com.microsoft", "Inverse") in _nodes(proto)
    assert _imports(proto).get("com.microsoft") == 1
    assert opbridge.DOMAIN not in _imports(proto)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    x = torch.from_numpy(random_matrices(rng, (4,), 3, np.float32))  # another batch size
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-3, atol=1e-5)


@pytest.mark.torch
@EXPORTERS
def test_com_microsoft_version_is_selectable(dynamo):
    import torch

    import opbridge.onnx

    note, _ = _torch_models()
    with pytest.warns(UserWarning, match="only at version 1"):
        proto = opbridge.onnx.export(note().eval(), (torch.randn(2, 3, 3),), dynamo=dynamo,
                                     custom_opsets={"com.microsoft": 5})
    assert ("com.microsoft", "Inverse") in _nodes(proto)
    assert _imports(proto)["com.microsoft"] == 5


@pytest.mark.torch
@EXPORTERS
def test_opbridge_domain_version_is_selectable(rng, dynamo):
    import torch

    import opbridge.onnx

    _, both = _torch_models()
    model = both().eval()
    proto = opbridge.onnx.export(model, (torch.randn(2, 3, 3),), dynamo=dynamo, lowering="custom",
                                 custom_opsets={opbridge.DOMAIN: 2})
    assert _imports(proto)[opbridge.DOMAIN] == 2
    x = random_matrices(rng, (3,), 3, np.float32)
    sess = opbridge.InferenceSession(proto)
    np.testing.assert_allclose(sess.run(None, {sess.get_inputs()[0].name: x})[0], model(torch.from_numpy(x)).numpy(),
                               rtol=1e-4, atol=1e-5)


# (lowering argument, expected domain of torch's inverse, expected domain of opbridge's)
LOWERINGS = [
    (None, "com.microsoft", "ai.opbridge"),
    ("custom", "ai.opbridge", "ai.opbridge"),
    # Global "standard" works although GroupNorm (not in this model) has no standard lowering.
    ("standard", "com.microsoft", "com.microsoft"),
    ({"inverse": "standard"}, "com.microsoft", "com.microsoft"),
    ({"torch_inverse": "custom", "inverse": "standard"}, "ai.opbridge", "com.microsoft"),
]


@pytest.mark.torch
@EXPORTERS
@pytest.mark.parametrize("lowering,torch_domain,ours_domain", LOWERINGS,
                         ids=["default", "custom", "standard", "ours-standard", "swapped"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_export_parity(rng, dynamo, lowering, torch_domain, ours_domain, dtype):
    """torch and ONNX Runtime agree for every lowering of both inverses, with either exporter;
    a model using only com.microsoft runs on a plain session."""
    import torch

    import opbridge.onnx

    _, both = _torch_models()
    model = both().eval()
    example = torch.from_numpy(random_matrices(rng, (2,), 4, dtype))
    proto = opbridge.onnx.export(model, (example,), dynamo=dynamo, lowering=lowering)
    domains = sorted(d for d, op in _nodes(proto) if op == "Inverse")
    assert domains == sorted([torch_domain, ours_domain])
    for domain in set(domains):
        assert domain in _imports(proto)
    if opbridge.DOMAIN in domains:
        sess = opbridge.InferenceSession(proto)
    else:
        sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    x = random_matrices(rng, (5,), 4, dtype)
    got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    ref = model(torch.from_numpy(x)).numpy()
    # y = -inv(x), whose entries are O(cond); compare relative to the largest.
    scale = np.abs(reference.inverse(x)).max()
    np.testing.assert_allclose(got, ref, rtol=0, atol=(1e-4 if dtype == np.float32 else 1e-12) * scale)


@pytest.mark.torch
def test_translation_table_with_torch_onnx_export(rng):
    """translation_table() is usable with torch.onnx.export directly."""
    import torch

    import opbridge.onnx

    _, both = _torch_models()
    model = both().eval()
    program = torch.onnx.export(model, (torch.randn(3, 3),), dynamo=True,
                                custom_translation_table=opbridge.onnx.translation_table(lowering="custom"))
    proto = program.model_proto
    assert [op for d, op in _nodes(proto) if d == opbridge.DOMAIN].count("Inverse") == 2
    x = random_matrices(rng, (), 3, np.float32)
    sess = opbridge.InferenceSession(proto)
    np.testing.assert_allclose(sess.run(None, {sess.get_inputs()[0].name: x})[0], model(torch.from_numpy(x)).numpy(),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.torch
def test_lowering_names_are_checked():
    import torch

    import opbridge.onnx

    _, both = _torch_models()
    with pytest.raises(ValueError, match="unknown op 'torch_inv'"):
        opbridge.onnx.export(both().eval(), (torch.randn(2, 3, 3),), lowering={"torch_inv": "custom"})
    with pytest.raises(ValueError, match="lowering must be one of"):
        opbridge.onnx.export(both().eval(), (torch.randn(2, 3, 3),), lowering="contrib")


@pytest.mark.torch
def test_exported_custom_node_reports_singular_matrix(rng):
    """A singular matrix in an exported model: ORT's error names the batch index."""
    import torch

    import opbridge.onnx
    import opbridge.ops

    class M(torch.nn.Module):
        def forward(self, x):
            return opbridge.ops.inverse(x)

    proto = opbridge.onnx.export(M().eval(), (torch.randn(2, 3, 3),))
    sess = opbridge.InferenceSession(proto)
    x = singular_batch(rng, "equal_rows", 3, np.float32, bad=(2,), size=4)
    with pytest.raises(Exception, match="matrix 2 of the batch is singular"):
        sess.run(None, {sess.get_inputs()[0].name: x})
