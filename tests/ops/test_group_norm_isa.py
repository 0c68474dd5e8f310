"""GroupNorm's CPU kernel on every instruction-set path (baseline, AVX2, AVX-512), each forced in
turn, so that all of them are tested on a machine that supports the widest one."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from opbridge import _core
from helpers.reference import group_norm as ref_group_norm

ISAS = ["baseline", "avx2", "avx512"]

try:
    import ml_dtypes

    CORE_DTYPES = [(np.float32, 2e-5), (np.float16, 4e-3), (ml_dtypes.bfloat16, 3e-2)]
except ImportError:  # bfloat16 is then covered through the torch op below
    CORE_DTYPES = [(np.float32, 2e-5), (np.float16, 4e-3)]

# (shape, groups): tails shorter than one vector, S = 1, channels of odd length, groups
# spanning several statistics blocks (4096 elements) with a remainder, one huge channel.
SHAPES = [
    ((2, 6, 5), 3),
    ((3, 8), 4),
    ((2, 4, 17, 3), 2),
    ((1, 8, 1031), 2),
    ((2, 64, 9, 9), 32),
    ((1, 3, 10007), 1),
]


@pytest.fixture(params=ISAS)
def core_isa(request):
    """Forces _core's kernels onto one instruction-set path for the test."""
    before = _core.cpu_isa()
    got = _core.set_cpu_isa(request.param)
    if got != request.param:
        _core.set_cpu_isa(before)
        pytest.skip(f"this CPU/build lacks {request.param} (best: {got})")
    yield request.param
    _core.set_cpu_isa(before)


def _inputs(rng, shape, dtype, offset=1.5):
    x = (rng.standard_normal(shape) * 3 + offset).astype(dtype)
    w = rng.uniform(0.5, 2.0, shape[1]).astype(dtype)
    b = rng.standard_normal(shape[1]).astype(dtype)
    return x, w, b


@pytest.mark.parametrize("dtype,tol", CORE_DTYPES, ids=[np.dtype(d).name for d, _ in CORE_DTYPES])
@pytest.mark.parametrize("shape,groups", SHAPES, ids=[f"{s}-G{g}" for s, g in SHAPES])
def test_core_matches_reference_on_each_path(core_isa, rng, shape, groups, dtype, tol):
    x, w, b = _inputs(rng, shape, dtype)
    eps = float(np.float32(rng.uniform(1e-6, 1e-3)))  # float attributes are float32 (docs/declarations.md)
    y = _core.group_norm(x, groups, w, b, eps)
    assert y.dtype == dtype and y.shape == x.shape
    ref = ref_group_norm(x, groups, w, b, eps)
    np.testing.assert_allclose(y.astype(np.float64), ref, rtol=tol, atol=tol * 4)
    np.testing.assert_allclose(_core.group_norm(x, groups).astype(np.float64), ref_group_norm(x, groups),
                               rtol=tol, atol=tol * 4)


def test_large_mean_keeps_precision(core_isa, rng):
    # mean 1e6, unit variance: float32 spacing at 1e6 is 0.06, so neither the statistics nor the
    # output's offset may be formed in float from x and the mean directly.
    x = (rng.standard_normal((2, 8, 40, 40)) + 1e6).astype(np.float32)
    w = rng.uniform(0.5, 2.0, 8).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    y = _core.group_norm(x, 4, w, b)
    np.testing.assert_allclose(y, ref_group_norm(x, 4, w, b), rtol=0, atol=2e-5)


def test_constant_groups_are_exact(core_isa, rng):
    # Each group constant (values unrelated to each other): x - mean is exactly 0, so y == bias.
    n, c, s, g = 2, 6, 5000, 3
    vals = rng.uniform(-1e6, 1e6, (n, g)).astype(np.float32)
    x = np.repeat(vals, c // g * s, axis=1).reshape(n, c, s)
    w = rng.uniform(0.5, 2.0, c).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    y = _core.group_norm(x, g, w, b)
    np.testing.assert_array_equal(y, np.broadcast_to(b[None, :, None], y.shape))


def test_channels_with_far_apart_means(core_isa, rng):
    # Within one group, channel means 0, 1e4, -3e3: blocks far from the running mean get
    # re-centred; the group variance is dominated by the spread of the channel means.
    x = rng.standard_normal((2, 3, 5000))
    x[:, 1] += 1e4
    x[:, 2] -= 3e3
    x = x.astype(np.float32)
    np.testing.assert_allclose(_core.group_norm(x, 1), ref_group_norm(x, 1), rtol=0, atol=2e-5)


def test_outlier_first_element(core_isa, rng):
    # The first element is the first block's shift; here it sits 1e4 standard deviations away.
    x = rng.standard_normal((1, 4, 3000)).astype(np.float32)
    x[0, 0, 0] = 1e4
    y = _core.group_norm(x, 2)
    np.testing.assert_allclose(y, ref_group_norm(x, 2), rtol=1e-6, atol=2e-5)


def _nhwc(x):
    """(N, C, *spatial) -> its (N, *spatial, C) memory (what channels_last=True takes)."""
    return np.ascontiguousarray(np.moveaxis(x, 1, -1))


@pytest.mark.parametrize("rows", [7, 3000])
def test_nhwc_outlier_in_first_row(core_isa, rng, rows):
    # [N, S, C]: a group's first shift is the mean of its first elements (its channels in the
    # first rows); one of them sits 1e4 standard deviations away, so that group (only) must be
    # summed again around its mean, in the first block and (rows=3000) in a sample cut into
    # several blocks.
    x = rng.standard_normal((2, 16, rows)).astype(np.float32)
    x[1, 5, 0] = 1e4
    w = rng.uniform(0.5, 2.0, 16).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    y = _core.group_norm(_nhwc(x), 4, w, b, channels_last=True)
    np.testing.assert_allclose(y, _nhwc(ref_group_norm(x, 4, w, b)), rtol=1e-6, atol=2e-5)


def test_nhwc_channels_with_far_apart_means(core_isa, rng):
    # [N, S, C], channel means 0, 1e4, -3e3, 5 within one group: the first row's mean is far from
    # every channel, and later blocks are re-centred per group.
    x = rng.standard_normal((2, 8, 3000))
    x[:, 1::4] += 1e4
    x[:, 2::4] -= 3e3
    x[:, 3::4] += 5
    x = x.astype(np.float32)
    y = _core.group_norm(_nhwc(x), 2, channels_last=True)
    np.testing.assert_allclose(y, _nhwc(ref_group_norm(x, 2)), rtol=0, atol=2e-5)


def test_nhwc_large_mean_keeps_precision(core_isa, rng):
    x = (rng.standard_normal((2, 24, 50, 41)) + 1e6).astype(np.float32)
    w = rng.uniform(0.5, 2.0, 24).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    y = _core.group_norm(_nhwc(x), 6, w, b, channels_last=True)
    np.testing.assert_allclose(y, _nhwc(ref_group_norm(x, 6, w, b)), rtol=0, atol=2e-5)


# [N, S, C] samples whose rows are no whole number of vectors (of 4, 8 or 16 floats), taken as runs
# of whole-vector periods (lcm(C, W) elements): four periods at a time, single periods, the rows
# left over; the statistics' periods in registers, in column blocks and in L1 (rows = S); and C
# whose period would be longer than 1024 elements (C = 1036: rows with masked ends).
NHWC_ODD_SHAPES = [
    ((2, 12, 32, 32), 4),
    ((2, 20, 23, 23), 5),
    ((3, 36, 7, 9), 4),
    ((2, 100, 9, 9), 4),
    ((2, 3, 33, 31), 1),
    ((1, 1036, 4, 4), 4),
]


@pytest.mark.parametrize("dtype,tol", CORE_DTYPES, ids=[np.dtype(d).name for d, _ in CORE_DTYPES])
@pytest.mark.parametrize("shape,groups", NHWC_ODD_SHAPES, ids=[f"{s}-G{g}" for s, g in NHWC_ODD_SHAPES])
def test_nhwc_rows_of_no_whole_vector(core_isa, rng, shape, groups, dtype, tol):
    x, w, b = _inputs(rng, shape, dtype)
    eps = float(np.float32(1e-5))
    # Channel means far apart in the first group (re-centred blocks).
    x[:, 1] = (x[:, 1].astype(np.float64) + 300).astype(dtype)
    ref = ref_group_norm(x, groups, w, b, eps)
    y = _core.group_norm(_nhwc(x), groups, w, b, eps, channels_last=True)
    assert y.dtype == dtype
    np.testing.assert_allclose(y.astype(np.float64), _nhwc(ref), rtol=tol, atol=tol * 4)
    # A channel whose coefficients are not finite (weight inf): evaluated apart, in double.
    w_inf = w.copy()
    w_inf[shape[1] - 1] = np.inf
    y = _core.group_norm(_nhwc(x), groups, w_inf, b, eps, channels_last=True)
    ref = _nhwc(ref_group_norm(x, groups, w_inf.astype(np.float64), b, eps))
    np.testing.assert_array_equal(np.isinf(y), np.isinf(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(y.astype(np.float64)[finite], ref[finite], rtol=tol, atol=tol * 4)


def test_nan_stays_in_its_group(core_isa, rng):
    x = rng.standard_normal((2, 4, 100)).astype(np.float32)
    x[1, 3, 7] = np.nan
    y = _core.group_norm(x, 2)
    assert np.isnan(y[1, 2:]).all()
    assert np.isfinite(y[0]).all() and np.isfinite(y[1, :2]).all()
    np.testing.assert_allclose(y[0], ref_group_norm(x[:1], 2)[0], rtol=2e-5, atol=2e-5)


def test_float16_subnormal_outputs(core_isa, rng):
    # weight 1e-6 puts the outputs in float16's subnormal range (< 6.1e-5): conversions must
    # round there too, not flush to zero.
    x = rng.standard_normal((2, 4, 77)).astype(np.float16)
    w = np.full(4, 1e-6, np.float16)
    y = _core.group_norm(x, 2, w)
    ref = ref_group_norm(x, 2, w.astype(np.float64))
    assert np.count_nonzero(y) > y.size // 2
    # Half a subnormal step (2^-25) for the rounding, plus float16's relative error of x.
    np.testing.assert_allclose(y.astype(np.float64), ref, rtol=2e-3, atol=2**-25 * 1.01)


def test_paths_agree(rng):
    x, w, b = _inputs(rng, (2, 32, 33, 35), np.float32)
    before = _core.cpu_isa()
    try:
        outs = {}
        for isa in ISAS:
            if _core.set_cpu_isa(isa) == isa:
                outs[isa] = _core.group_norm(x, 8, w, b)
    finally:
        _core.set_cpu_isa(before)
    base = outs.pop("baseline")
    for isa, y in outs.items():
        np.testing.assert_allclose(y, base, rtol=1e-5, atol=1e-5, err_msg=isa)



def test_backward_runs_the_variant_a_call_asks_for(rng):
    """The backward honours a call's isa as the forward does: each variant asked for by name gives
    what that variant gives as _core's level, bit for bit (the variants differ in the last bits)."""
    x, w, b = _inputs(rng, (2, 32, 33, 35), np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    before = _core.cpu_isa()
    try:
        by_level = {}
        for isa in ISAS:
            if _core.set_cpu_isa(isa) == isa:
                by_level[isa] = _core.group_norm_backward(dy, x, 8, w, b)
        if len(by_level) < 2:
            pytest.skip("this CPU/build has one instruction-set variant")
        _core.set_cpu_isa("avx512")  # the best this CPU has
        for isa, want in by_level.items():
            got = _core.group_norm_backward(dy, x, 8, w, b, isa=isa)
            for name, g, e in zip(("dx", "dweight", "dbias"), got, want):
                np.testing.assert_array_equal(g, e, err_msg=f"{isa}: {name}")
    finally:
        _core.set_cpu_isa(before)

# The fused [N, C, S] schedule (each group's statistics summed while the group before it is
# normalized) takes channels of whole steps of four vectors (S a multiple of 64 serves AVX-512
# too), groups that fit the cache budget, and x aligned to a vector; it must give exactly what
# the split schedule gives (the backward recomputes the statistics the split way), whichever way
# the groups fall into tasks. It is taken without an activation only (with SiLU both runs take the
# split schedule, checked against the reference all the same). Run in subprocesses:
# OPBRIDGE_GROUP_NORM_FUSE is read once.
_FUSED_SCRIPT = """
import sys
import numpy as np
from opbridge import _core
cases = dict(np.load(sys.argv[1]))
out = {}
def aligned(a):
    buf = np.empty(a.nbytes + 64, np.uint8)
    off = (-buf.ctypes.data) % 64
    v = buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    v[...] = a
    return v
for isa in ("baseline", "avx2", "avx512"):
    if _core.set_cpu_isa(isa) != isa:
        continue
    for name in sorted({k.rsplit("/", 1)[0] for k in cases}):
        x, w, b = (aligned(cases[name + "/" + k]) for k in ("x", "w", "b"))
        g, eps = int(cases[name + "/g"]), float(cases[name + "/eps"])
        for act in ("none", "silu"):
            out[f"{isa}/{name}/{act}"] = _core.group_norm(x, g, w, b, eps, act)
np.savez(sys.argv[2], **out)
"""


def test_fused_schedule_gives_the_split_schedules_bits(rng, tmp_path):
    cases = {}

    def add(name, x, g, eps=1e-5, w=None, b=None):
        c = x.shape[1]
        cases.update({f"{name}/x": x.astype(np.float32), f"{name}/g": np.int64(g), f"{name}/eps": np.float64(eps),
                      f"{name}/w": (rng.uniform(0.5, 2.0, c) if w is None else w).astype(np.float32),
                      f"{name}/b": (rng.standard_normal(c) if b is None else b).astype(np.float32)})

    add("conv", rng.standard_normal((3, 64, 16, 16)) * 3 + 1.5, 32)
    # Groups of two channels of 4160: three statistics blocks each, a channel boundary inside one.
    add("blocks", rng.standard_normal((2, 6, 4160)) * 2 - 0.5, 3)
    add("offset", rng.standard_normal((2, 8, 1024)) + 1e5, 4)
    outlier = rng.standard_normal((2, 8, 1024))
    outlier[1, 2, 0] = 1e4  # the group's first shift, far from its mean: summed again around it
    add("outlier", outlier, 4)
    const = rng.standard_normal((2, 8, 256))
    const[0, 2:4] = 0.75  # a constant group with eps = 0: its channels take the exact path
    add("constant", const, 4, eps=0.0)
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, **cases)
    outs = {}
    for fuse in ("0", "1"):
        script = tmp_path / "run.py"
        script.write_text(_FUSED_SCRIPT)
        env = dict(os.environ, OPBRIDGE_GROUP_NORM_FUSE=fuse)
        r = subprocess.run([sys.executable, str(script), str(inputs), str(tmp_path / f"out{fuse}.npz")], env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        outs[fuse] = dict(np.load(tmp_path / f"out{fuse}.npz"))
    assert outs["0"].keys() == outs["1"].keys() and outs["0"]
    for key, split in outs["0"].items():
        np.testing.assert_array_equal(outs["1"][key], split, err_msg=key)
        isa, name, act = key.split("/")
        x, g = cases[f"{name}/x"], int(cases[f"{name}/g"])
        ref = ref_group_norm(x, g, cases[f"{name}/w"], cases[f"{name}/b"], float(cases[f"{name}/eps"]), act)
        ok = np.isfinite(ref)
        assert (np.isnan(split) == np.isnan(ref)).all(), key
        np.testing.assert_allclose(split[ok], ref[ok], rtol=2e-5, atol=1e-4, err_msg=key)


# Streaming stores (OPBRIDGE_GROUP_NORM_STREAM_BYTES=0 streams every output) store what ordinary
# stores do: channels-last samples within the cache budget (one task per sample, normalized four
# rows per load of the coefficients where four rows span at most 1 KiB), with leftover rows and
# channels, 16-bit types, a constant group taken in double, and the per-row and tiled paths.
_STREAM_SCRIPT = """
import sys
import numpy as np
import torch
import opbridge
cases = dict(np.load(sys.argv[1]))
out = {}
for name in sorted({k.rsplit("/", 1)[0] for k in cases}):
    x, w, b = (torch.from_numpy(cases[name + "/" + k]) for k in ("x", "w", "b"))
    dt = getattr(torch, str(cases[name + "/dtype"]))
    x, w, b = (t.to(dt) for t in (x, w, b))
    x = x.contiguous(memory_format=torch.channels_last)
    g, eps = int(cases[name + "/g"]), float(cases[name + "/eps"])
    for act in ("none", "silu"):
        y = opbridge.ops.group_norm(x, g, w, b, eps, act)
        assert y.is_contiguous(memory_format=torch.channels_last)
        out[f"{name}/{act}"] = y.double().numpy()
np.savez(sys.argv[2], **out)
"""


@pytest.mark.torch
def test_streamed_stores_give_the_same_bits(rng, tmp_path):
    torch = pytest.importorskip("torch")
    cases = {}

    def add(name, shape, g, dtype="float32", eps=1e-5, x=None):
        c = shape[1]
        cases.update({f"{name}/x": rng.standard_normal(shape) * 2 + 0.5 if x is None else x,
                      f"{name}/g": np.int64(g), f"{name}/eps": np.float64(eps), f"{name}/dtype": np.array(dtype),
                      f"{name}/w": rng.uniform(0.5, 2.0, c), f"{name}/b": rng.standard_normal(c)})

    add("c32", (8, 32, 6, 5), 8)  # 30 rows: seven steps of four, two left
    add("c64", (9, 64, 5, 5), 32)
    add("c40", (8, 40, 3, 7), 8)  # 40 channels: 8 left per row after the steps of 16 (AVX2)
    add("bf16", (8, 96, 4, 5), 32, "bfloat16")
    add("f16", (8, 128, 3, 3), 32, "float16")
    add("c128", (8, 128, 3, 3), 32)  # 512 B rows: one row at a time
    add("tiles", (2, 32, 40, 40), 8)  # two samples: tiles
    const = rng.standard_normal((8, 32, 6, 5)) * 2 + 0.5
    const[3, 4:8] = 0.75  # a constant group with eps = 0: its channels are taken in double
    add("constant", (8, 32, 6, 5), 8, eps=0.0, x=const)
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, **cases)
    script = tmp_path / "run.py"
    script.write_text(_STREAM_SCRIPT)
    outs = {}
    for stream in ("0", None):
        env = dict(os.environ, OMP_NUM_THREADS="2")
        env.pop("OPBRIDGE_GROUP_NORM_STREAM_BYTES", None)
        if stream is not None:
            env["OPBRIDGE_GROUP_NORM_STREAM_BYTES"] = stream
        r = subprocess.run([sys.executable, str(script), str(inputs), str(tmp_path / f"out{stream}.npz")], env=env,
                           capture_output=True, text=True, timeout=300, check=False)
        assert r.returncode == 0, r.stderr
        outs[stream] = dict(np.load(tmp_path / f"out{stream}.npz"))
    assert outs["0"].keys() == outs[None].keys() and outs["0"]
    for key, streamed in outs["0"].items():
        np.testing.assert_array_equal(streamed, outs[None][key], err_msg=key)
        name, act = key.split("/")
        dt = str(cases[f"{name}/dtype"])
        # The reference takes the inputs as the op saw them (rounded to its dtype).
        x, w, b = (torch.from_numpy(cases[f"{name}/{k}"]).to(getattr(torch, dt)).double().numpy() for k in "xwb")
        ref = ref_group_norm(x, int(cases[f"{name}/g"]), w, b, float(cases[f"{name}/eps"]), act)
        tol = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}[dt]
        np.testing.assert_allclose(streamed, ref, rtol=tol, atol=tol * 4, err_msg=key)


@pytest.mark.torch
def test_torch_op_gives_the_same_bits_on_any_number_of_threads(rng):
    # Each task sums its first group on its own and the rest during the normalization before
    # them (fused schedule): the split into tasks must not show in the result.
    torch = pytest.importorskip("torch")
    import opbridge

    x, w, b = (torch.from_numpy(a) for a in _inputs(rng, (3, 64, 16, 16), np.float32))
    before = torch.get_num_threads()
    try:
        ys = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            ys.append(opbridge.ops.group_norm(x, 32, w, b, 1e-5, "silu"))
    finally:
        torch.set_num_threads(before)
    for y in ys[1:]:
        assert torch.equal(y, ys[0])


def test_set_cpu_isa_rejects_unknown_names():
    with pytest.raises(ValueError, match="set_cpu_isa: name must be 'auto', 'baseline', 'avx2' or 'avx512', got 'sse9'"):
        _core.set_cpu_isa("sse9")


def test_auto_is_the_best_supported():
    before = _core.cpu_isa()
    try:
        best = _core.set_cpu_isa("auto")
        assert _core.cpu_isa_supported(best)
        assert all(not _core.cpu_isa_supported(i) for i in ISAS[ISAS.index(best) + 1:])
    finally:
        _core.set_cpu_isa(before)


def test_environment_variable_caps_the_level():
    code = "from opbridge import _core; print(_core.cpu_isa())"
    env = dict(os.environ, OPBRIDGE_CPU_ISA="baseline")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "baseline"


@pytest.mark.torch
def test_environment_variable_caps_the_torch_library():
    pytest.importorskip("torch")
    code = "import torch, opbridge; print(torch.ops.opbridge._cpu_isa())"
    env = dict(os.environ, OPBRIDGE_CPU_ISA="baseline")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "baseline"


# ---- the torch op on every path, all four dtypes -------------------------------------------


# torch_isa: the fixture in conftest.py.


TORCH_TOL = {"float32": 2e-5, "float64": 1e-12, "float16": 4e-3, "bfloat16": 3e-2}


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("shape,groups", SHAPES, ids=[f"{s}-G{g}" for s, g in SHAPES])
def test_torch_op_on_each_path(torch_isa, rng, shape, groups, dtype):
    import torch

    import opbridge

    tdt = getattr(torch, dtype)
    x, w, b = (torch.from_numpy(a).to(tdt) for a in _inputs(rng, shape, np.float64))
    y = opbridge.ops.group_norm(x, groups, w, b, 1e-4)
    assert y.dtype == tdt
    # eps as the op uses it: float32, as ONNX stores float attributes (docs/declarations.md).
    ref = ref_group_norm(x.double().numpy(), groups, w.double().numpy(), b.double().numpy(), float(np.float32(1e-4)))
    tol = TORCH_TOL[dtype]
    np.testing.assert_allclose(y.double().numpy(), ref, rtol=tol, atol=tol * 4)


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_op_16bit_output_is_the_rounded_float_result(torch_isa, rng, dtype):
    # The 16-bit kernels compute exactly what the float32 kernel computes on the widened input,
    # then round to nearest even: bit for bit torch's own float -> 16-bit conversion.
    import torch

    import opbridge

    tdt = getattr(torch, dtype)
    x = torch.from_numpy(rng.standard_normal((2, 8, 300)) * 3).to(tdt)
    w = torch.from_numpy(rng.uniform(0.5, 2.0, 8)).to(tdt)
    b = torch.from_numpy(rng.standard_normal(8)).to(tdt)
    y = opbridge.ops.group_norm(x, 4, w, b)
    y32 = opbridge.ops.group_norm(x.float(), 4, w.float(), b.float())
    assert torch.equal(y.view(torch.int16), y32.to(tdt).view(torch.int16))


# The kernel's optional per-group statistics (mean / rstd) are a path of the C++ API only:
# tests/install/test_cmake_consumer.py checks them through tests/install/cmake_consumer/group_norm_direct.cpp.
