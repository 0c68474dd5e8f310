"""opbridge.testing.check_op on opbridge's own ops (GroupNorm, Inverse) with float64 numpy
references (tests/helpers/reference.py), and that it reports failures readably: a wrong reference, a
wrong gradient, a silently differentiable first-order-only op."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import reference

torch = pytest.importorskip("torch")
import opbridge.ops  # noqa: E402
import opbridge.testing  # noqa: E402
from opbridge.testing import OpCheckError  # noqa: E402

pytestmark = pytest.mark.torch


def _gn_ref(x, num_groups, weight=None, bias=None, eps=1e-5, activation="none"):
    assert activation == "none"
    eps = float(np.float32(eps))  # a float attribute is float32 in every call (as ONNX stores it)
    w = None if weight is None else weight.numpy()
    b = None if bias is None else bias.numpy()
    return reference.group_norm(x.numpy(), num_groups, w, b, eps)


def _gn_samples():
    # Fresh random values; shapes with and without spatial dims, affine and not, eps not default.
    return [
        (torch.randn(2, 6, 5, 4), 3, torch.randn(6), torch.randn(6)),
        (torch.randn(3, 4) * 3 + 1, 2, None, None, 1e-3),
        (torch.randn(1, 8, 7), 8, torch.rand(8) + 0.5, None),
    ]


def _well_conditioned(*shape):
    n = shape[-1]
    return torch.randn(*shape) + 3 * n ** 0.5 * torch.eye(n)


def test_group_norm():
    report = opbridge.testing.check_op("opbridge::group_norm", _gn_ref, _gn_samples(),
                                       dtypes=[torch.float32, torch.float64])
    names = [c.name for c in report.checks if c.status == "ok"]
    # Both exporters, both lowerings (GroupNorm has a standard one), ORT against torch.
    for exporter in ("dynamo", "torchscript"):
        for lowering in ("custom", "standard"):
            assert f"ONNX Runtime CPU vs torch, {exporter} export, lowering {lowering}, float32, sample 0" in names
    assert "gradgradcheck, sample 0" in names
    assert "torch.library.opcheck float32, sample 2" in names
    assert "arrays (opbridge._core) float32, sample 2" in names


def test_inverse():
    report = opbridge.testing.check_op(
        "opbridge::inverse", lambda x, on_singular="raise": reference.inverse(x.numpy()),
        [(_well_conditioned(3, 4, 4),), (_well_conditioned(5, 5),), (_well_conditioned(2, 1, 3, 3), "raise")],
        tolerances={torch.float32: (1e-4, 1e-5)})
    names = [c.name for c in report.checks if c.status == "ok"]
    assert "ONNX Runtime CPU vs torch, torchscript export, lowering standard, float64, sample 0" in names
    assert "gradgradcheck, sample 1" in names


def test_accepts_the_torch_op_and_its_declaration():
    x = _well_conditioned(2, 3, 3)
    ref = lambda x, on_singular="raise": reference.inverse(x.numpy())  # noqa: E731
    for op in (torch.ops.opbridge.inverse, torch.ops.opbridge.inverse.default,
               opbridge._op_library.opbridge_library().ops["inverse"]):
        report = opbridge.testing.check_op(op, ref, [(x,)], export=False, gradcheck=False, opcheck=False)
        assert report.op == "opbridge::inverse"


def test_wrong_reference_is_a_readable_failure():
    def wrong(x, num_groups, weight=None, bias=None, eps=1e-5, activation="none"):
        return _gn_ref(x, num_groups, weight, bias, eps) * 1.001

    with pytest.raises(OpCheckError) as info:
        opbridge.testing.check_op("opbridge::group_norm", wrong, _gn_samples()[:1], export=False, gradcheck=False,
                                  opcheck=False, cuda=False, dtypes=[torch.float32, torch.float64])
    text = str(info.value)
    # torch's forward and the kernel on arrays (opbridge._core) both differ from it.
    assert text.startswith("check_op(opbridge::group_norm): 4 failed, 0 passed")
    assert "FAIL  forward float32, sample 0:" in text and "FAIL  forward float64, sample 0:" in text
    assert "FAIL  arrays (opbridge._core) float64, sample 0:" in text
    assert "elements differ; worst at index" in text and "atol" in text


# Both tests below replace opbridge::inverse's autograd registration for a while: torch.library
# allows that from torch 2.13 on (allow_override=True); torch 2.11 and 2.12 refuse a second
# registration ("already a kernel registered from python").
_replaces_registration = pytest.mark.skipif(
    tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) < (2, 13),
    reason="torch.library replaces an autograd registration only from torch 2.13 on")


@_replaces_registration
@pytest.mark.filterwarnings("ignore:Warning only once for all operators")
def test_wrong_gradient_fails_gradcheck():
    # A backward that is off by 1%: gradcheck must catch it, and nothing else fails.
    import importlib

    inv = importlib.import_module("opbridge.ops.inverse")  # the module (opbridge.ops.inverse is the function)

    def bad_backward(ctx, grad):
        dx, none = inv._backward(ctx, grad)
        return 1.01 * dx, none

    # torch.library lets a registration be replaced; the original (a composite of torch ops,
    # registered with double_backward=True, i.e. as is) is put back afterwards.
    torch.library.register_autograd("opbridge::inverse", bad_backward, setup_context=inv._setup_context)
    try:
        report = opbridge.testing.check_op(
            "opbridge::inverse", lambda x, on_singular="raise": reference.inverse(x.numpy()),
            [(_well_conditioned(2, 3, 3),)], export=False, opcheck=False, raise_on_failure=False)
    finally:
        torch.library.register_autograd("opbridge::inverse", inv._backward, setup_context=inv._setup_context)
    failed = [c.name for c in report.failures]
    assert failed == ["gradcheck, sample 0"], str(report)
    assert "Jacobian mismatch" in str(report)


def test_unknown_op_is_a_clear_error():
    with pytest.raises(ValueError, match="not a declared op of any library opbridge knows"):
        opbridge.testing.check_op("nosuchns::op", lambda x: x, [(torch.ones(2),)])
    with pytest.raises(ValueError, match="namespace::name"):
        opbridge.testing.check_op("group_norm", lambda x: x, [(torch.ones(2),)])
    with pytest.raises(ValueError, match="at least one sample"):
        opbridge.testing.check_op("opbridge::inverse", lambda x: x, [])


def test_report_lists_every_check():
    report = opbridge.testing.check_op(
        "opbridge::inverse", lambda x, on_singular="raise": reference.inverse(x.numpy()),
        [(_well_conditioned(4, 4),)], dtypes=[torch.float64], exporters=["dynamo"], lowerings=["custom"])
    text = str(report)
    assert text.splitlines()[0].startswith("check_op(opbridge::inverse): 0 failed")
    assert np.all([c.status in ("ok", "skip") for c in report.checks])


@_replaces_registration
@pytest.mark.filterwarnings("ignore:Warning only once for all operators")
def test_first_order_only_op_gets_the_second_order_guard_checked():
    # Registered as first-order only, Inverse's gradients must not be silently differentiable:
    # check_op verifies that differentiating them raises NotImplementedError, and runs no
    # gradgradcheck. (Restored afterwards to its real registration, differentiable twice.)
    import importlib

    inv = importlib.import_module("opbridge.ops.inverse")
    opbridge.ops.register_autograd("opbridge::inverse", inv._backward, setup_context=inv._setup_context,
                                   double_backward=False)
    try:
        report = opbridge.testing.check_op(
            "opbridge::inverse", lambda x, on_singular="raise": reference.inverse(x.numpy()),
            [(_well_conditioned(3, 3),)], export=False, opcheck=False)
    finally:
        opbridge.ops.register_autograd("opbridge::inverse", inv._backward, setup_context=inv._setup_context,
                                       double_backward=True)
    names = {c.name: c.status for c in report.checks}
    assert names["second-order gradients are a clear error, sample 0"] == "ok"
    assert "gradgradcheck, sample 0" not in names


def test_integer_outputs_are_compared_exactly():
    # Points on a line, x = i / 16 (exact in float32): farthest point sampling from point 0 takes
    # the far end, then the middle. A reference off by one at index 15000 is within float32's
    # tolerance (1e-5 + 1e-4 * 15000 > 1) and must still fail.
    n = 30001
    xyz = torch.zeros(1, n, 3, dtype=torch.float64)
    xyz[0, :, 0] = torch.arange(n, dtype=torch.float64) / 16
    right = np.array([[0, n - 1, (n - 1) // 2]], dtype=np.int64)
    args = {"export": False, "gradcheck": False, "opcheck": False, "cuda": False, "dtypes": [torch.float32]}
    opbridge.testing.check_op("opbridge::furthest_point_sample", lambda x, m: right, [(xyz, 3)], **args)
    wrong = right + np.array([[0, 0, 1]])
    with pytest.raises(OpCheckError) as info:
        opbridge.testing.check_op("opbridge::furthest_point_sample", lambda x, m: wrong, [(xyz, 3)], **args)
    assert "(int64 output, compared exactly); first at index (0, 2): got 15000, expected 15001" in str(info.value)
