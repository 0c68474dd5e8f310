"""opbridge.onnx.export's dynamic batch (python/opbridge/onnx/_dynamic.py): which inputs get a
dynamic dim 0, the warnings, and the checks of the caller's own dynamic shapes -- as pure functions
and end to end with both exporters and ONNX Runtime."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from helpers import reference

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch")
import opbridge  # noqa: E402
import opbridge.onnx  # noqa: E402
import opbridge.ops  # noqa: E402
from opbridge.onnx import _dynamic  # noqa: E402

EXPORTERS = pytest.mark.parametrize("dynamo", (True, False), ids=["dynamo", "torchscript"])


def _dims(spec):
    """{axis: Dim name} of one dynamic_shapes entry."""
    return None if spec is None else {a: d.__name__ for a, d in spec.items()}


# ---- the rule, as a pure function ---------------------------------------------------------------


def test_only_inputs_with_the_example_batch_are_dynamic():
    args = (torch.randn(2, 8, 5), torch.randn(8), torch.randn(2), 3, torch.tensor(1.0), None)
    names = ["x", "w", "t", "k", "s", "n"]
    p = _dynamic.plan(args, names, {}, dynamo=True, dynamic_batch=True)
    assert [_dims(s) for s in p.kwargs["dynamic_shapes"]] == [{0: "batch"}, None, {0: "batch"}, None, None, None]
    assert p.dynamic == ("x", "t") and p.warnings == ()
    # One Dim object for all of them: torch.export then keeps them equal.
    shapes = p.kwargs["dynamic_shapes"]
    assert shapes[0][0] is shapes[2][0]
    p = _dynamic.plan(args, names, {}, dynamo=False, dynamic_batch=True)
    assert p.kwargs == {"dynamic_axes": {"x": {0: "batch"}, "t": {0: "batch"}}}


def test_batch_comes_from_the_first_tensor_of_rank_1_or_more():
    args = (1.5, torch.tensor(2.0), torch.randn(3, 4), torch.randn(4, 3), torch.randn(3))
    p = _dynamic.plan(args, ["a", "b", "c", "d", "e"], {}, dynamo=False, dynamic_batch=True)
    assert p.kwargs == {"dynamic_axes": {"c": {0: "batch"}, "e": {0: "batch"}}}


@pytest.mark.parametrize("name,make", [
    ("weight", lambda: torch.randn(4)),
    ("gn_bias", lambda: torch.randn(4)),
    ("scale", lambda: torch.randn(4, 3)),
    ("w", lambda: torch.nn.Parameter(torch.randn(4))),
    ("w", lambda: torch.randn(4, requires_grad=True)),
], ids=["weight", "gn_bias", "scale-2d", "parameter", "requires_grad"])
def test_parameter_like_input_of_batch_length_stays_static_with_a_warning(name, make):
    args = (torch.randn(4, 6), make())
    p = _dynamic.plan(args, ["x", name], {}, dynamo=True, dynamic_batch=True)
    assert [_dims(s) for s in p.kwargs["dynamic_shapes"]] == [{0: "batch"}, None]
    assert len(p.warnings) == 1
    assert f"input {name!r}" in p.warnings[0] and "looks like a parameter" in p.warnings[0]
    assert "equals the example batch" in p.warnings[0]


@pytest.mark.parametrize("name", ["timestep", "t", "mask", "noise_level", "biased_flag"])
def test_per_sample_input_of_batch_length_is_dynamic_without_warning(name):
    p = _dynamic.plan((torch.randn(4, 6), torch.randn(4)), ["x", name], {}, dynamo=True, dynamic_batch=True)
    assert p.dynamic == ("x", name) and p.warnings == ()


def test_no_dynamic_batch_or_callers_own_shapes_add_nothing():
    args = (torch.randn(2, 3),)
    assert _dynamic.plan(args, ["x"], {}, dynamo=True, dynamic_batch=False).kwargs == {}
    for kwargs in ({"dynamic_shapes": None}, {"dynamic_shapes": ({1: torch.export.Dim("n")},)},
                   {"dynamic_axes": {"x": {1: "n"}}}):
        dynamo = "dynamic_shapes" in kwargs
        assert _dynamic.plan(args, ["x"], kwargs, dynamo=dynamo, dynamic_batch=True) == _dynamic.Plan()


# ---- the caller's dynamic shapes are checked --------------------------------------------------------

_B = torch.export.Dim("b")


@pytest.mark.parametrize("kwargs,dynamo,message", [
    ({"dynamic_shapes": ({0: _B},), "dynamic_axes": {"x": [0]}}, True, "either dynamic_shapes .* or dynamic_axes"),
    ({"dynamic_shapes": ({0: _B},)}, False, "dynamic_shapes is for the dynamo exporter"),
    ({"dynamic_shapes": ({0: _B},)}, True, r"dynamic_shapes has 1 entries, but the model gets 2 inputs \['x', 'w'\]"),
    ({"dynamic_shapes": {"x": {0: _B}, "weight": None}}, True, r"unknown inputs \['weight'\].*\['x', 'w'\]"),
    ({"dynamic_shapes": ({3: _B}, None)}, True, r"dynamic_shapes\['x'\] marks axis 3 dynamic, but 'x' has rank 3"),
    ({"dynamic_shapes": ({0: _B}, {0: _B})}, True,
     r"Dim 'b' for axis 0 of 'x' \(size 2 in the example\) and for axis 0 of 'w' \(size 8\)"),
    ({"dynamic_shapes": ([_B, None], None)}, True, r"dynamic_shapes\['x'\] has 2 entries, but 'x' has rank 3"),
    ({"dynamic_axes": {"w": {1: "c"}}}, False, r"dynamic_axes\['w'\] marks axis 1 dynamic, but 'w' has rank 1"),
    ({"dynamic_shapes": "batch"}, True, "must be a tuple/list"),
], ids=["both", "shapes-torchscript", "count", "names", "axis", "dim-sizes", "list-rank", "axes-rank", "type"])
def test_conflicting_dynamic_shapes_are_a_clear_error(kwargs, dynamo, message):
    args = (torch.randn(2, 8, 5), torch.randn(8))
    with pytest.raises(ValueError, match=message):
        _dynamic.plan(args, ["x", "w"], kwargs, dynamo=dynamo, dynamic_batch=True)


# ---- end to end -------------------------------------------------------------------------------


class WeightAsInput(torch.nn.Module):
    """GroupNorm whose per-channel weight is an input (as a functional model passes it)."""

    def forward(self, x, weight):
        return opbridge.ops.group_norm(x, 2, weight, None, 1e-5)


class Denoiser(torch.nn.Module):
    """The signature of a diffusion UNet: sample (B, C, H, W), timestep (B,), context (B, L, D)."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.GroupNorm(2, 4)
        self.proj = torch.nn.Linear(6, 4)

    def forward(self, sample, timestep, context):
        t = timestep[:, None, None, None]
        c = self.proj(context).mean(1)[:, :, None, None]
        return opbridge.ops.group_norm(sample * t + c, 2, self.norm.weight, self.norm.bias, 1e-5)


def _input_dims(proto):
    return {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in proto.graph.input}


def _export(model, args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        proto = opbridge.onnx.export(model.eval(), args, **kwargs)
    return proto, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


@EXPORTERS
def test_weight_input_of_another_length_stays_static(rng, dynamo):
    x = torch.randn(2, 8, 5)
    w = torch.rand(8) + 0.5
    proto, messages = _export(WeightAsInput(), (x, w), dynamo=dynamo)
    assert messages == []
    dims = _input_dims(proto)
    assert dims["weight"] == [8] and dims["x"][0] == "batch" and dims["x"][1:] == [8, 5]
    sess = opbridge.InferenceSession(proto)
    x3 = rng.standard_normal((3, 8, 5)).astype(np.float32)  # another batch
    w3 = rng.uniform(0.5, 1.5, 8).astype(np.float32)
    got = sess.run(None, {"x": x3, "weight": w3})[0]
    np.testing.assert_allclose(got, reference.group_norm(x3, 2, w3), rtol=1e-4, atol=1e-4)


@EXPORTERS
def test_timestep_and_context_follow_the_batch_without_warnings(rng, dynamo):
    model = Denoiser().eval()
    args = (torch.randn(2, 4, 3, 3), torch.rand(2), torch.randn(2, 5, 6))
    proto, messages = _export(model, args, dynamo=dynamo)
    # No "The axis name: batch will not be used" (nor any other) note for the shared batch.
    assert messages == []
    dims = _input_dims(proto)
    assert [dims[n][0] for n in ("sample", "timestep", "context")] == ["batch"] * 3
    sess = opbridge.InferenceSession(proto)
    feeds = {"sample": rng.standard_normal((5, 4, 3, 3)).astype(np.float32),
             "timestep": rng.uniform(0, 1, 5).astype(np.float32),
             "context": rng.standard_normal((5, 5, 6)).astype(np.float32)}
    with torch.no_grad():
        want = model(*(torch.from_numpy(v) for v in feeds.values())).numpy()
    np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)


@EXPORTERS
def test_parameter_of_batch_length_warns_and_exports(rng, dynamo):
    # C == B == 4 in the example: the weight is kept static (it could not follow the batch).
    proto, messages = _export(WeightAsInput(), (torch.randn(4, 4, 5), torch.rand(4) + 0.5), dynamo=dynamo)
    assert len(messages) == 1 and "input 'weight'" in messages[0], messages
    assert _input_dims(proto)["weight"] == [4]
    sess = opbridge.InferenceSession(proto)
    x = rng.standard_normal((2, 4, 5)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 4).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x, "weight": w})[0], reference.group_norm(x, 2, w),
                               rtol=1e-4, atol=1e-4)


def test_callers_conflicting_shapes_fail_before_the_exporter_runs():
    with pytest.raises(ValueError, match=r"dynamic_shapes has 1 entries, but the model gets 2 inputs \['x', 'weight'\]"):
        opbridge.onnx.export(WeightAsInput(), (torch.randn(2, 8, 5), torch.rand(8)),
                             dynamic_shapes=({0: torch.export.Dim("b")},))


def test_callers_own_shapes_are_used(rng):
    n = torch.export.Dim("n")
    proto, _ = _export(WeightAsInput(), (torch.randn(2, 8, 5), torch.rand(8)),
                       dynamic_shapes={"x": {2: n}, "weight": None})
    assert _input_dims(proto)["x"] == [2, 8, "n"]


def test_forward_with_var_positional_inputs_gets_a_dynamic_batch(tmp_path):
    # forward(self, *xs): torch.export takes the *xs entries of dynamic_shapes as one tuple.
    class Sum(torch.nn.Module):
        def forward(self, *xs):
            return opbridge.ops.group_norm(xs[0] + xs[1], 2)

    x, y = torch.randn(3, 4, 5), torch.randn(3, 4, 5)
    proto = opbridge.onnx.export(Sum(), (x, y))
    dims = [i.type.tensor_type.shape.dim[0] for i in proto.graph.input]
    assert all(d.HasField("dim_param") for d in dims), dims
    got = opbridge.InferenceSession(proto).run(None, {i.name: t.numpy() for i, t in zip(proto.graph.input, (x[:2], y[:2]))})
    with torch.no_grad():
        np.testing.assert_allclose(got[0], Sum()(x[:2], y[:2]).numpy(), rtol=1e-5, atol=1e-5)
