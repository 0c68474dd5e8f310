"""One declaration per op: the same verdict everywhere, versions, attribute checks.

The differential test feeds the same inputs (valid and invalid) to the torch op, its fake kernel,
ONNX Runtime (CPU) and opbridge._core: all reject with the same message core, or all accept with
matching results (compared with a float64 reference). Rejections that happen before our code
runs (ORT's type check at load, torch's dispatcher, nanobind's argument conversion) only need to
agree on the verdict.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import opbridge
from opbridge._op_library import opbridge_library
from helpers.reference import group_norm as gn_ref

torch = pytest.importorskip("torch")
import opbridge.ops  # noqa: E402
import opbridge.onnx  # noqa: E402

pytestmark = pytest.mark.torch

_NP = {"float32": np.float32, "float64": np.float64}
_ONNX = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE}


def _gn_model(x, w, b, attrs, opset_version=1):
    inputs = [helper.make_tensor_value_info("x", _ONNX[str(x.dtype)], list(x.shape))]
    names = ["x"]
    for name, v in (("scale", w), ("bias", b)):
        if v is None:
            names.append("")
        else:
            inputs.append(helper.make_tensor_value_info(name, _ONNX[str(v.dtype)], list(v.shape)))
            names.append(name)
    while names and names[-1] == "":
        names.pop()
    node = helper.make_node("GroupNorm", names, ["y"], domain="ai.opbridge", name="gn", **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", _ONNX[str(x.dtype)], list(x.shape))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.opbridge", opset_version)], ir_version=9)


def _verdicts(x, w, b, num_groups, eps):
    """(verdict, message or result) of each implementation."""
    out = {}
    tx = torch.from_numpy(x)
    tw = None if w is None else torch.from_numpy(w)
    tb = None if b is None else torch.from_numpy(b)
    try:
        out["torch"] = ("ok", torch.ops.opbridge.group_norm(tx, num_groups, tw, tb, eps).numpy())
    except Exception as e:  # noqa: BLE001 - the verdict is what is compared
        out["torch"] = ("error", str(e))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fx = mode.from_tensor(tx)
        fw = None if tw is None else mode.from_tensor(tw)
        fb = None if tb is None else mode.from_tensor(tb)
        try:
            torch.ops.opbridge.group_norm(fx, num_groups, fw, fb, eps)
            out["fake"] = ("ok", None)
        except Exception as e:  # noqa: BLE001
            out["fake"] = ("error", str(e))
    try:
        sess = opbridge.InferenceSession(_gn_model(x, w, b, {"num_groups": num_groups, "epsilon": float(eps)}))
        feeds = {"x": x, **({"scale": w} if w is not None else {}), **({"bias": b} if b is not None else {})}
        out["ort"] = ("ok", sess.run(None, feeds)[0])
    except Exception as e:  # noqa: BLE001
        out["ort"] = ("error", str(e))
    try:
        from opbridge import _core

        out["core"] = ("ok", _core.group_norm(x, num_groups, w, b, eps))
    except Exception as e:  # noqa: BLE001
        out["core"] = ("error", str(e))
    return out


def _core_message(message: str) -> str:
    # The part after the op label: "opbridge::group_norm: <core>" (torch, fake),
    # "... ai.opbridge::GroupNorm (node 'gn'): <core>" (ORT), "group_norm: <core>" (_core).
    m = re.search(r"(?:opbridge::group_norm|ai\.opbridge::GroupNorm(?: \(node '[^']*'\))?|^group_norm): (.*)$",
                  message, re.S)
    return m.group(1).strip() if m else message


CASES = [
    # (id, x shape, weight shape or None, bias shape or None, num_groups, eps, expected message core or None)
    ("valid", (2, 6, 5), (6,), (6,), 3, 1e-5, None),
    ("valid_no_params", (3, 4, 2, 2), None, None, 2, 1e-3, None),
    ("valid_weight_only", (1, 8), (8,), None, 4, 1e-5, None),
    ("valid_empty", (0, 6, 3), (6,), (6,), 3, 1e-5, None),
    ("groups_do_not_divide", (2, 6, 5), None, None, 4, 1e-5,
     "num_groups must divide the number of channels C = x.shape[1] = 6, got num_groups = 4"),
    ("groups_zero", (2, 6, 5), None, None, 0, 1e-5, "num_groups must be > 0, got 0"),
    ("rank1", (6,), None, None, 1, 1e-5, "x must have rank >= 2 (N, C, *), got rank 1"),
    ("weight_2d", (2, 6, 5), (2, 3), None, 3, 1e-5, "weight must be 1-D (one value per channel), got shape [2, 3]"),
    ("weight_length", (2, 6, 5), (5,), None, 3, 1e-5, "weight must have C = 6 elements (one per channel), got 5"),
    ("bias_length", (2, 6, 5), (6,), (7,), 3, 1e-5, "bias must have C = 6 elements (one per channel), got 7"),
    ("eps_negative", (2, 6, 5), None, None, 3, -1.0, "eps must be finite and >= 0, got -1.000000"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_group_norm_same_verdict_everywhere(rng, case, dtype):
    _, shape, wshape, bshape, groups, eps, expected = case
    x = rng.standard_normal(shape).astype(dtype) * 3 + 1
    w = None if wshape is None else rng.standard_normal(wshape).astype(dtype)
    b = None if bshape is None else rng.standard_normal(bshape).astype(dtype)
    verdicts = _verdicts(x, w, b, groups, eps)
    if expected is None:
        assert {k: v[0] for k, v in verdicts.items()} == dict.fromkeys(verdicts, "ok"), verdicts
        if x.size == 0:
            for name in ("torch", "ort", "core"):
                assert verdicts[name][1].shape == x.shape, name
            return
        tol = 1e-5 if dtype == "float32" else 1e-10
        for name in ("torch", "ort", "core"):
            # Float attributes are float32 in every call (as ONNX stores them): each side computes
            # with float32(eps), which moves the result of a group of variance ~1e-3 by ~1e-10.
            e = float(np.float32(eps))
            ref = gn_ref(x.astype(np.float64), groups, None if w is None else w.astype(np.float64),
                         None if b is None else b.astype(np.float64), e)
            np.testing.assert_allclose(verdicts[name][1], ref, rtol=tol, atol=tol, err_msg=name)
    else:
        assert {k: v[0] for k, v in verdicts.items()} == dict.fromkeys(verdicts, "error"), verdicts
        for name, (_, message) in verdicts.items():
            assert _core_message(message) == expected, f"{name}: {message}"


def test_dtype_mismatch_same_verdict(rng):
    """A float64 weight for a float32 x: our check in torch, its fake kernel and _core; ORT's own
    type check at load (same verdict, ORT's words)."""
    x = rng.standard_normal((2, 6, 5)).astype(np.float32)
    w = rng.standard_normal(6)
    verdicts = _verdicts(x, w, None, 3, 1e-5)
    assert {k: v[0] for k, v in verdicts.items()} == dict.fromkeys(verdicts, "error"), verdicts
    for name in ("torch", "fake", "core"):
        assert _core_message(verdicts[name][1]) == "weight must have the dtype of x (float32), got float64", verdicts


def test_misspelled_attribute_is_caught_where_the_whole_node_is_visible(rng):
    """ORT cannot list a node's attributes: 'epsilion' would be ignored there (eps falls back to
    its default). opbridge.InferenceSession, opbridge check and onnx.checker catch it."""
    import onnxruntime as ort

    x = rng.standard_normal((2, 6, 5)).astype(np.float32)
    model = _gn_model(x, None, None, {"num_groups": 3, "epsilion": 0.5})
    plain = ort.InferenceSession(model.SerializeToString(), opbridge.session_options(),
                                 providers=["CPUExecutionProvider"])
    plain.run(None, {"x": x})  # what users would get without the check: silently eps = 1e-5
    with pytest.raises(ValueError, match="unknown attribute 'epsilion'; GroupNorm has activation, epsilon, num_groups"):
        opbridge.InferenceSession(model)
    with pytest.raises(onnx.checker.ValidationError, match="epsilion"):
        onnx.checker.check_model(model, full_check=True)
    assert opbridge.onnx.check_attributes(model)


def test_attribute_of_a_newer_version_needs_that_version(rng):
    """activation exists since ai.opbridge version 2: a node using it in a model that imports
    version 1 is refused by opbridge (ORT would run v1 semantics)."""
    x = rng.standard_normal((2, 6, 5)).astype(np.float32)
    problems = opbridge.onnx.check_attributes(_gn_model(x, None, None, {"num_groups": 3, "activation": "silu"}, 1))
    assert any("needs ai.opbridge version 2" in p for p in problems), problems
    assert not opbridge.onnx.check_attributes(_gn_model(x, None, None, {"num_groups": 3, "activation": "silu"}, 2))


def test_a_model_newer_than_the_library_is_refused(rng):
    """A model importing a later version of ai.opbridge than the library implements is refused by
    opbridge.InferenceSession (ONNX Runtime itself never compares a custom domain's import version
    with the kernels' version ranges, so it would run it with the library's older semantics)."""
    lib = opbridge_library()
    x = rng.standard_normal((2, 6, 5)).astype(np.float32)
    model = _gn_model(x, None, None, {"num_groups": 3}, lib.domain_version + 1)
    with pytest.raises(ValueError, match=f"newer than this library's {lib.domain_version}: upgrade"):
        opbridge.InferenceSession(model)
    ok = _gn_model(x, None, None, {"num_groups": 3}, lib.domain_version)
    np.testing.assert_allclose(opbridge.InferenceSession(ok).run(None, {"x": x})[0], gn_ref(x.astype(np.float64), 3),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_export_stamps_the_lowest_version_that_expresses_the_model(dynamo):
    class M(torch.nn.Module):
        def forward(self, x):
            return opbridge.ops.inverse(x)

    proto = opbridge.onnx.export(M(), (torch.randn(2, 3, 3),), dynamo=dynamo)
    assert {i.domain: i.version for i in proto.opset_import}["ai.opbridge"] == 1
    node = next(n for n in proto.graph.node if n.domain == "ai.opbridge")
    assert [a.name for a in node.attribute] == []  # on_singular="raise" is the default: not written
    with pytest.raises(ValueError, match="custom_opsets asks for ai.opbridge version 0"):
        opbridge.onnx.export(M(), (torch.randn(2, 3, 3),), dynamo=dynamo, custom_opsets={"ai.opbridge": 0})


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_an_argument_of_a_later_version_raises_the_import_only_when_used(dynamo):
    # GroupNorm's activation is .since(2) (docs/declarations.md, "Versions"): at its default the
    # model needs version 1 and the attribute is not written; "silu" makes it version 2.
    class M(torch.nn.Module):
        def __init__(self, activation):
            super().__init__()
            self.activation = activation

        def forward(self, x):
            return opbridge.ops.group_norm(x, 2, activation=self.activation)

    x = torch.randn(2, 4, 3)
    for activation, version in (("none", 1), ("silu", 2)):
        proto = opbridge.onnx.export(M(activation), (x,), dynamo=dynamo)
        assert {i.domain: i.version for i in proto.opset_import}["ai.opbridge"] == version, activation
        node = next(n for n in proto.graph.node if n.domain == "ai.opbridge")
        assert ("activation" in [a.name for a in node.attribute]) == (activation != "none")


def test_declarations_are_described_consistently():
    """The JSON the library describes its ops with matches the torch schema derived from the same
    declaration (argument names, order, defaults)."""
    lib = opbridge_library()
    for op in lib.ops.values():
        schema = getattr(torch.ops.opbridge, op.name).default._schema
        assert [a.name for a in schema.arguments] == [a.name for a in op.args], op.name
        for arg, decl in zip(schema.arguments, op.args):
            if hasattr(decl, "optional"):
                assert (arg.type.kind() == "OptionalType") == decl.optional
            elif decl.has_default:
                assert arg.default_value == pytest.approx(decl.default) if decl.type == "float" else \
                    arg.default_value == decl.default


def test_export_leaves_torchscript_registry_as_it_found_it():
    """After opbridge.onnx.export(dynamo=False), a plain torch.onnx.export behaves as if opbridge
    had never been used: torch.inverse is not an ai.opbridge node, and a symbolic the user
    registered before is back in place."""
    import io

    class Inv(torch.nn.Module):
        def forward(self, x):
            return torch.inverse(x)

    x = torch.randn(2, 3, 3)
    registry = opbridge.onnx._exporter_rules._torchscript_registry()
    group = registry.get_function_group("aten::linalg_inv")
    assert group is None or 1 not in group._functions._overrides, "another test left a symbolic registered"
    opbridge.onnx.export(Inv(), (x,), dynamo=False, lowering="custom")
    with pytest.raises(Exception, match="linalg_inv"):
        torch.onnx.export(Inv(), (x,), io.BytesIO(), dynamo=False)

    def user_symbolic(g, x):
        return g.op("com.example::MyInverse", x)

    torch.onnx.register_custom_op_symbolic("aten::linalg_inv", user_symbolic, 1)
    try:
        opbridge.onnx.export(Inv(), (x,), dynamo=False, lowering="custom")
        buf = io.BytesIO()
        torch.onnx.export(Inv(), (x,), buf, dynamo=False, custom_opsets={"com.example": 1})
        ops = [(n.domain, n.op_type) for n in onnx.load_from_string(buf.getvalue()).graph.node]
        assert ("com.example", "MyInverse") in ops, ops
    finally:
        torch.onnx.unregister_custom_op_symbolic("aten::linalg_inv", 1)


def test_second_order_gradients_of_an_op_without_them_are_a_clear_error():
    """register_autograd(double_backward=False): first order works, second order raises naming
    the op (never silently treats the gradient as a constant)."""
    from opbridge.ops import register_autograd

    lib = torch.library.Library("opbridge_test_dbl", "FRAGMENT")
    lib.define("scale(Tensor x) -> Tensor")
    lib.impl("scale", lambda x: x * 3.0, "CPU")
    lib.define("scale_backward(Tensor g) -> Tensor")
    lib.impl("scale_backward", lambda g: g * 3.0, "CPU")

    def setup(ctx, inputs, output):
        pass

    def backward(ctx, g):
        return torch.ops.opbridge_test_dbl.scale_backward(g)

    register_autograd("opbridge_test_dbl::scale", backward, setup_context=setup)
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(torch.ops.opbridge_test_dbl.scale(x).pow(2).sum(), x, create_graph=True)
    np.testing.assert_allclose(g.detach().numpy(), 18 * x.detach().numpy())
    with pytest.raises(NotImplementedError, match="second-order gradients of opbridge_test_dbl::scale"):
        g.sum().backward()


def test_python_constants_are_the_declarations():
    """What the Python side knows of an op's arguments it reads from the declaration: the names of
    GroupNorm's activations, its default eps (the torch op's Python function, the nn module), the
    op version its activation needs and the ONNX op type (the fusion), the library's domain."""
    import importlib
    import inspect

    import opbridge.nn

    # By module name: opbridge.ops.group_norm is also a function's name.
    gn_ops = importlib.import_module("opbridge.ops.group_norm")
    _fusion = importlib.import_module("opbridge.onnx._group_norm_fusion")

    decl = opbridge_library().ops["group_norm"]
    assert gn_ops.ACTIVATIONS == decl.arg("activation").choices
    assert inspect.signature(opbridge.ops.group_norm).parameters["eps"].default == decl.arg("eps").default
    assert inspect.signature(opbridge.nn.GroupNorm).parameters["eps"].default == decl.arg("eps").default
    assert _fusion.ACTIVATION_DOMAIN_VERSION == decl.arg("activation").since
    assert _fusion.OP_TYPE == decl.onnx_type
    assert _fusion.SILU in decl.arg("activation").choices
    assert opbridge.DOMAIN == _fusion.DOMAIN == opbridge_library().domain
    with pytest.raises(ValueError, match="activation must be 'none' or 'silu', got 'relu'"):
        opbridge.nn.GroupNorm(2, 4, activation="relu")


@pytest.mark.parametrize("channels, dims_known, refused", [(6, True, True), (8, True, False), (6, False, False)])
def test_static_shapes_that_fail_the_checks_are_refused_at_load(channels, dims_known, refused):
    # ORT accepts such a model and fails only at run; opbridge.InferenceSession refuses it at load,
    # with the op's own message. Unknown sizes leave the verdict to the run.
    shape = [2, channels, 3] if dims_known else ["N", "C", 3]
    node = helper.make_node("GroupNorm", ["x"], ["y"], domain=opbridge.DOMAIN, num_groups=4, name="gn")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(opbridge.DOMAIN, 2)],
                              ir_version=9)
    message = f"num_groups must divide the number of channels C = x.shape[1] = {channels}, got num_groups = 4"
    x = np.random.default_rng().standard_normal((2, channels, 3)).astype(np.float32)
    if refused:
        with pytest.raises(ValueError, match=r"ai\.opbridge::GroupNorm \(node 'gn'\): " + re.escape(message)):
            opbridge.InferenceSession(model)
        return
    sess = opbridge.InferenceSession(model)
    if channels % 4:
        with pytest.raises(Exception, match=re.escape(message)):
            sess.run(None, {"x": x})
    else:
        (y,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(y, gn_ref(x.astype(np.float64), 4, None, None, 1e-5), rtol=1e-4, atol=1e-5)
