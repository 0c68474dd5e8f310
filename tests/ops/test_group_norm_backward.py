"""GroupNorm's vectorized CPU backward (float32 / float16 / bfloat16) on each instruction-set path
(the torch_isa fixture, conftest.py): dx, dweight, dbias against the float64 reference, over
shapes that reach every loop of the kernels (several blocks per channel, several tiles per
sample, channel and row tails), both memory formats and both activations; precision at a large
common offset and with an outlier; NaN confinement."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import opbridge  # noqa: E402
import opbridge.ops  # noqa: E402
from helpers.reference import group_norm_backward as ref_backward  # noqa: E402

pytestmark = pytest.mark.torch


def _channels_last(t):
    order = (0, *range(2, t.dim()), 1)
    inv = [order.index(i) for i in range(t.dim())]
    return t.permute(order).contiguous().permute(inv)


# (shape, groups): channels longer than one summation block (S > 2048) with a tail; a channel-last
# sample cut into several tiles; C not a multiple of any vector width; one channel per group;
# a single group; rank 3 and 5; tiny spatial extent; short channels (S <= 128, or 256 with SiLU:
# summed several channels at a time) in groups of more channels than a vector has lanes, with
# remainders.
SHAPES = [
    ((2, 8, 64, 70), 4),
    ((1, 24, 96, 100), 6),
    ((3, 20, 7, 9), 5),
    ((2, 6, 5, 4), 6),
    ((2, 12, 33, 31), 1),
    ((3, 12, 517), 4),
    ((2, 8, 3, 4, 5), 2),
    ((4, 32, 2, 1), 8),
    ((2, 80, 8, 8), 2),
    ((2, 36, 5, 7), 2),
    ((2, 40, 10, 20), 2),
]
IDS = [f"{s}-G{g}" for s, g in SHAPES]


def _case(rng, shape, offset=0.3):
    x = torch.from_numpy(rng.standard_normal(shape) * 1.7 + offset)
    c = shape[1]
    w = torch.from_numpy(rng.standard_normal(c))
    b = torch.from_numpy(rng.standard_normal(c) * 0.5)
    dy = torch.from_numpy(rng.standard_normal(shape))
    return x, w, b, dy


def _check(got, want, tol):
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got.double().numpy(), want, rtol=0, atol=tol * scale)


@pytest.mark.parametrize("act", ["none", "silu"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("shape,groups", SHAPES, ids=IDS)
def test_backward_matches_reference(torch_isa, rng, shape, groups, layout, act):
    x, w, b, dy = _case(rng, shape)
    want_dx, want_dw, want_db = ref_backward(x.numpy(), groups, w.numpy(), dy.numpy(), 1e-5, bias=b.numpy(),
                                             activation=act)
    xs, dys = x.float(), dy.float()
    if layout == "channels_last":
        xs, dys = _channels_last(xs), _channels_last(dys)
    dx, dw, db = torch.ops.opbridge.group_norm_backward(dys, xs, groups, w.float(), b.float(), 1e-5, act)
    _check(dx, want_dx, 2e-5)
    _check(dw, want_dw, 2e-5)
    _check(db, want_db, 2e-5)
    assert dx.stride() == xs.stride()


@pytest.mark.parametrize("act", ["none", "silu"])
def test_channels_last_samples_in_several_waves(torch_isa, rng, act):
    # 70 channels-last samples of 64 KB, each with its own scale and offset: the backward takes
    # them in waves of as many samples as x and dy fit four cache budgets (half the L2 each; at
    # most 2 MiB on the CPUs this runs on, so at most 64 samples a wave): two waves or more, the
    # later ones starting at samples other than 0, whose statistics and sums must be their own.
    n, c, h, w_ = 70, 64, 16, 16
    scale = rng.uniform(0.5, 3.0, (n, 1, 1, 1))
    offset = rng.uniform(-2.0, 2.0, (n, 1, 1, 1))
    x = torch.from_numpy((rng.standard_normal((n, c, h, w_)) * scale + offset).astype(np.float32))
    dy = torch.from_numpy(rng.standard_normal((n, c, h, w_)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal(c))
    b = torch.from_numpy(rng.standard_normal(c) * 0.5)
    want = ref_backward(x.double().numpy(), 8, w.numpy(), dy.double().numpy(), 1e-5, bias=b.numpy(), activation=act)
    got = torch.ops.opbridge.group_norm_backward(_channels_last(dy), _channels_last(x), 8, w.float(), b.float(), 1e-5,
                                                 act)
    for g, wnt in zip(got, want):
        _check(g, wnt, 2e-5)


@pytest.mark.parametrize("act", ["none", "silu"])
def test_channels_last_calls_of_different_sizes_in_turn(torch_isa, rng, act):
    # The channels-last backward keeps its per-tile scratch on the calling thread between calls:
    # a call after a larger one (more tiles, more channels) and after a smaller one must use
    # none of what they left there.
    for shape, groups in [((2, 96, 40, 60), 8), ((3, 16, 20, 10), 4), ((2, 96, 40, 60), 8), ((1, 48, 90, 70), 3)]:
        x, w, b, dy = _case(rng, shape)
        want = ref_backward(x.numpy(), groups, w.numpy(), dy.numpy(), 1e-5, bias=b.numpy(), activation=act)
        got = torch.ops.opbridge.group_norm_backward(_channels_last(dy.float()), _channels_last(x.float()), groups,
                                                     w.float(), b.float(), 1e-5, act)
        for g, wnt in zip(got, want):
            _check(g, wnt, 2e-5)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_backward_without_affine(torch_isa, rng, layout):
    x, _, _, dy = _case(rng, (2, 16, 40, 60))
    want_dx, want_dw, want_db = ref_backward(x.numpy(), 4, None, dy.numpy(), 1e-5)
    xs, dys = x.float(), dy.float()
    if layout == "channels_last":
        xs, dys = _channels_last(xs), _channels_last(dys)
    xs.requires_grad_()
    opbridge.ops.group_norm(xs, 4, None, None, 1e-5).backward(dys)
    _check(xs.grad, want_dx, 2e-5)
    dx, dw, db = torch.ops.opbridge.group_norm_backward(dys, xs.detach(), 4, None, None, 1e-5, "none")
    _check(dw, want_dw, 2e-5)
    _check(db, want_db, 2e-5)


@pytest.mark.parametrize("dtype,tol", [("float16", 6e-3), ("bfloat16", 5e-2)])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_16bit_backward(torch_isa, rng, dtype, tol, layout):
    tdt = getattr(torch, dtype)
    x, w, b, dy = (t.to(tdt) for t in _case(rng, (2, 24, 48, 50)))
    want = ref_backward(x.double().numpy(), 6, w.double().numpy(), dy.double().numpy(), 1e-5,
                        bias=b.double().numpy(), activation="silu")
    if layout == "channels_last":
        x, dy = _channels_last(x), _channels_last(dy)
    got = torch.ops.opbridge.group_norm_backward(dy, x, 6, w, b, 1e-5, "silu")
    for g, wnt in zip(got, want):
        assert g.dtype == tdt
        _check(g, wnt, tol)


# The channels-last backward reads x and dy that come from memory (x at least the streaming
# threshold, OPBRIDGE_GROUP_NORM_STREAM_BYTES: 0 here) in rows of 1 KiB or more one row at a time,
# in its sums pass and its dx pass (gn_bwd_row_by_row_moments, gn_bwd_rows_dx): whole vectors and
# a channel tail, several tiles, 16-bit rows, a large common offset (summed over blocks of 128
# rows there), and short rows beside them (four rows a step). Run in a subprocess on every
# instruction set this CPU has: the threshold is read once.
_FROM_MEMORY_SCRIPT = """
import sys
import numpy as np
import torch
import opbridge.ops
cases = dict(np.load(sys.argv[1]))
out = {}
for isa in ("baseline", "avx2", "avx512"):
    if torch.ops.opbridge._set_cpu_isa(isa) != isa:
        continue
    for name in sorted({k.rsplit("/", 1)[0] for k in cases}):
        x, dy, w, b = (torch.from_numpy(cases[name + "/" + k]) for k in ("x", "dy", "w", "b"))
        dt = getattr(torch, str(cases[name + "/dtype"]))
        x, dy = (t.to(dt).contiguous(memory_format=torch.channels_last) for t in (x, dy))
        for act in ("none", "silu"):
            got = torch.ops.opbridge.group_norm_backward(dy, x, int(cases[name + "/g"]), w.to(dt), b.to(dt), 1e-5, act)
            assert got[0].is_contiguous(memory_format=torch.channels_last)
            for k, t in zip(("dx", "dw", "db"), got):
                out[f"{isa}/{name}/{act}/{k}"] = t.double().numpy()
np.savez(sys.argv[2], **out)
"""


def test_channels_last_backward_from_memory(rng, tmp_path):
    cases = {}

    def add(name, shape, g, dtype="float32", offset=0.3):
        x, w, b, dy = _case(rng, shape, offset)
        x, dy = (t.to(getattr(torch, dtype)).double().numpy() for t in (x, dy))
        cases.update({f"{name}/x": x, f"{name}/dy": dy, f"{name}/w": w.numpy(), f"{name}/b": b.numpy(),
                      f"{name}/g": np.int64(g), f"{name}/dtype": np.array(dtype)})

    add("long", (2, 264, 9, 7), 8)  # 1056-byte rows: 33 vectors of 8, 16.5 of 16
    add("tail", (2, 260, 11, 5), 20)  # 4 channels past the last vector of 8
    add("tiles", (1, 256, 48, 40), 32)  # 1920 rows of 1 KiB: several tiles
    add("bf16", (2, 512, 6, 7), 16, "bfloat16")  # 1 KiB rows of 16-bit
    add("offset", (2, 256, 12, 12), 4, offset=1e6)  # 144 rows: two blocks of 128 and 16
    add("short", (3, 64, 9, 9), 8)  # 256-byte rows: four rows a step
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, **cases)
    script = tmp_path / "run.py"
    script.write_text(_FROM_MEMORY_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="2", OPBRIDGE_GROUP_NORM_STREAM_BYTES="0")
    r = subprocess.run([sys.executable, str(script), str(inputs), str(tmp_path / "out.npz")], env=env,
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    out = dict(np.load(tmp_path / "out.npz"))
    assert any(k.startswith("baseline/") for k in out), sorted(out)[:5]
    for name in {k.rsplit("/", 1)[0] for k in cases}:
        dt = str(cases[f"{name}/dtype"])
        tol = 2e-3 if name == "offset" else {"float32": 2e-5, "bfloat16": 5e-2}[dt]
        w, b = (torch.from_numpy(cases[f"{name}/{k}"]).to(getattr(torch, dt)).double().numpy() for k in "wb")
        for act in ("none", "silu"):
            want = ref_backward(cases[f"{name}/x"], int(cases[f"{name}/g"]), w, cases[f"{name}/dy"], 1e-5, bias=b,
                                activation=act)
            isas = sorted({k.split("/")[0] for k in out if f"/{name}/{act}/" in k})
            assert isas
            for isa in isas:
                for k, wnt in zip(("dx", "dw", "db"), want):
                    got = out[f"{isa}/{name}/{act}/{k}"]
                    scale = max(1.0, float(np.abs(wnt).max()))
                    np.testing.assert_allclose(got, wnt, rtol=0, atol=tol * scale, err_msg=f"{isa}/{name}/{act}/{k}")


@pytest.mark.parametrize("act", ["none", "silu"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("shape", [(2, 16, 30, 41), (2, 48, 9, 7)])
def test_backward_at_large_offset(torch_isa, rng, shape, layout, act):
    # Mean 1e6, spread 1.7: x - mean keeps its digits in float32 only if the mean is
    # subtracted as the forward does (m_hi + m_lo); the gradient must stay that accurate.
    # Long channels, and short ones (summed several channels at a time).
    x, w, b, dy = _case(rng, shape, offset=1e6)
    x32 = x.float()
    want = ref_backward(x32.double().numpy(), 4, w.numpy(), dy.numpy(), 1e-5, bias=b.numpy(), activation=act)
    xs, dys = x32, dy.float()
    if layout == "channels_last":
        xs, dys = _channels_last(xs), _channels_last(dys)
    got = torch.ops.opbridge.group_norm_backward(dys, xs, 4, w.float(), b.float(), 1e-5, act)
    for g, wnt in zip(got, want):
        _check(g, wnt, 2e-3)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_nan_stays_in_its_group(torch_isa, rng, layout):
    x, w, b, dy = _case(rng, (2, 8, 20, 30))
    x[1, 2, 3, 4] = float("nan")  # sample 1, group 1 (channels 2-3)
    xs, dys = x.float(), dy.float()
    if layout == "channels_last":
        xs, dys = _channels_last(xs), _channels_last(dys)
    dx, dw, db = torch.ops.opbridge.group_norm_backward(dys, xs, 4, w.float(), b.float(), 1e-5, "silu")
    bad = torch.zeros(dx.shape, dtype=torch.bool)
    bad[1, 2:4] = True
    assert torch.isnan(dx[bad]).all()
    assert torch.isfinite(dx[~bad]).all()
    want_dx = ref_backward(x[:1].numpy(), 4, w.numpy(), dy[:1].numpy(), 1e-5, bias=b.numpy(), activation="silu")[0]
    _check(dx[:1], want_dx, 2e-5)
    assert torch.isnan(dw[2:4]).all() and torch.isfinite(dw[[0, 1, 4, 5, 6, 7]]).all()


@pytest.mark.parametrize("act", ["none", "silu"])
def test_channels_last_outlier_in_first_row(torch_isa, rng, act):
    # Channels-last: a group's first shift comes from its channels in the first row; one of them
    # 1e4 standard deviations away makes that group's block be summed again around its own mean,
    # its dy sums included (without an activation they are taken in the same read), over a
    # sample of several blocks and tiles.
    x, w, b, dy = _case(rng, (2, 16, 60, 70))
    x[1, 5, 0, 0] = 1e4
    want = ref_backward(x.numpy(), 4, w.numpy(), dy.numpy(), 1e-5, bias=b.numpy(), activation=act)
    got = torch.ops.opbridge.group_norm_backward(_channels_last(dy.float()), _channels_last(x.float()), 4,
                                                 w.float(), b.float(), 1e-5, act)
    for g, wnt in zip(got, want):
        _check(g, wnt, 2e-5)


@pytest.mark.parametrize("act", ["none", "silu"])
@pytest.mark.parametrize("shape,groups", [((2, 8, 128, 128), 2), ((1, 2048, 16, 8), 1)], ids=["long", "short"])
def test_contiguous_group_far_from_its_first_shift(torch_isa, rng, shape, groups, act):
    # Contiguous, without an activation, the moments and the channel sums are taken in one pass
    # around the group's first shift (the mean of its first 16 elements). Here the first 16
    # elements of the last sample's last group are 1e4 away from the rest of it (65536 or 262144
    # elements): its mean lies further from the shift than its spread, and summed around the shift
    # its variance and channel sums lose digits (dweight and that group's dx off by 3e-5 to 9e-5 of
    # their size); they must be taken again around the mean. Long channels, and short ones
    # (summed several at a time). Each checked against its own size: that group's dx is small
    # beside the others'.
    x, w, b, dy = _case(rng, shape)
    n, cg = shape[0] - 1, shape[1] // groups
    c0 = (groups - 1) * cg
    x[n, c0].view(-1)[:16] = 1e4
    x32 = x.float()
    want = ref_backward(x32.double().numpy(), groups, w.numpy(), dy.numpy(), 1e-5, bias=b.numpy(), activation=act)
    got = torch.ops.opbridge.group_norm_backward(dy.float(), x32, groups, w.float(), b.float(), 1e-5, act)
    parts = [(got[0][n, c0:], want[0][n, c0:]), (got[0], want[0]), (got[1], want[1]), (got[2], want[2])]
    for g, wnt in parts:
        np.testing.assert_allclose(g.double().numpy(), wnt, rtol=0, atol=5e-6 * float(np.abs(wnt).max()))


def test_backward_checks_come_from_the_declarations(rng):
    # group_norm_backward declares no check of its own: gradient_of(group_norm) runs the forward's
    # checks on the forward's arguments, then grad against the shape of the forward's output, in
    # the kernel and in the fake kernel alike (cpp/common/call_checks.cpp, check_call).
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.from_numpy(rng.standard_normal((2, 4, 3)))
    bad_grad = torch.from_numpy(rng.standard_normal((2, 4, 5)))
    shape_msg = r"grad must have the shape of group_norm's output Y \[2, 4, 3\] \(rule 'x'\), got \[2, 4, 5\]"
    with pytest.raises(RuntimeError, match=shape_msg):
        torch.ops.opbridge.group_norm_backward(bad_grad, x, 2, None, None, 1e-5, "none")
    with pytest.raises(RuntimeError, match=r"num_groups must divide the number of channels C = x.shape\[1\] = 4"):
        torch.ops.opbridge.group_norm_backward(torch.randn_like(x), x, 3, None, None, 1e-5, "none")
    with FakeTensorMode() as mode:
        with pytest.raises(ValueError, match=shape_msg):
            torch.ops.opbridge.group_norm_backward(mode.from_tensor(bad_grad), mode.from_tensor(x), 2, None, None,
                                                   1e-5, "none")
    # ONNX Runtime's GroupNormBackward kernel: the same verdict and message.
    import onnxruntime as ort
    from helpers.onnx_models import single_node_model

    model = single_node_model("GroupNormBackward", "ai.opbridge", [("grad", np.float64, [2, 4, 5]),
                                                                    ("X", np.float64, [2, 4, 3])],
                              {"num_groups": 2}, n_outputs=3)
    sess = ort.InferenceSession(model.SerializeToString(), opbridge.session_options(),
                                providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match=r"ai.opbridge::GroupNormBackward: " + shape_msg):
        sess.run(None, {"grad": bad_grad.numpy(), "X": x.numpy()})
    # A right-sized grad passes both checks and gives the reference's gradients.
    grad = torch.from_numpy(rng.standard_normal((2, 4, 3)))
    dx, dw, db = torch.ops.opbridge.group_norm_backward(grad, x, 2, None, None, 1e-5, "none")
    ref = ref_backward(x.numpy(), 2, None, grad.numpy(), 1e-5)
    np.testing.assert_allclose(dx.numpy(), ref[0], rtol=1e-9, atol=1e-9)
