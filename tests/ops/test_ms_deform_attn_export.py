"""Export of opbridge::ms_deform_attn to ai.opbridge::MultiScaleDeformableAttention with both torch
exporters, run in ONNX Runtime and compared with torch; the OpSchema and its shape inference."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import opbridge
from helpers import reference
from helpers.msda_inputs import assert_within, f64, forward_allowance, make_inputs

EXPORTERS = pytest.mark.parametrize("dynamo", (True, False), ids=["dynamo", "torchscript"])
# The dynamo exporter notes that the Dims it was given are named as given (torch 2.13).
pytestmark = pytest.mark.filterwarnings("ignore:# The axis name:UserWarning")
NAMES = ["value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"]


def _nodes(proto):
    return [(n.domain, n.op_type) for n in proto.graph.node]


def _imports(proto):
    return {o.domain: o.version for o in proto.opset_import}


def _attn_module():
    import torch

    import opbridge.ops

    class Attn(torch.nn.Module):
        def forward(self, value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
            return opbridge.ops.ms_deform_attn(value, spatial_shapes, level_start_index, sampling_locations,
                                               attention_weights)

    return Attn().eval()


def _dynamic(dynamo):
    """Dynamic batch and query count (spatial_shapes / level_start_index are (L, 2) / (L,))."""
    from torch.export import Dim

    if dynamo:
        b, q = Dim("batch"), Dim("queries")
        return {"dynamic_shapes": ({0: b}, None, None, {0: b, 1: q}, {0: b, 1: q})}
    axes = {"value": {0: "batch"}, "sampling_locations": {0: "batch", 1: "queries"},
            "attention_weights": {0: "batch", 1: "queries"}}
    return {"dynamic_axes": axes, "input_names": NAMES}


def _torch(args):
    import torch

    return tuple(torch.from_numpy(a) for a in args)


@pytest.mark.torch
@EXPORTERS
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_export_parity(rng, dynamo, dtype):
    model = _attn_module()
    levels = [(6, 5), (3, 3), (1, 2)]
    proto = opbridge.onnx.export(model, _torch(make_inputs(rng, levels, 2, 2, 4, 7, 2, dtype)), dynamo=dynamo,
                                 **_dynamic(dynamo))
    assert _nodes(proto) == [(opbridge.DOMAIN, "MultiScaleDeformableAttention")]
    assert _imports(proto)[opbridge.DOMAIN] == 2
    onnx.checker.check_model(proto, full_check=True)
    sess = opbridge.InferenceSession(proto)
    other = make_inputs(rng, levels, 3, 2, 4, 11, 2, dtype)  # another batch and query count
    got = sess.run(None, dict(zip([i.name for i in sess.get_inputs()], other)))[0]
    assert got.shape == (3, 11, 8) and got.dtype == other[0].dtype
    torch_out = model(*_torch(other)).numpy()
    np.testing.assert_array_equal(got, torch_out)  # the same kernel behind both
    assert_within(got, reference.ms_deform_attn(f64(other[0]), other[1], other[2], f64(other[3]), f64(other[4])),
                  forward_allowance(other, dtype))


def _encoder_attention(spatial_shapes_from):
    """One Deformable-DETR encoder attention layer computing its inputs the way transformers does:
    spatial_shapes and level_start_index from the feature maps' sizes, reference points at the
    pixel centres, locations = reference + offsets / (W, H)."""
    import torch
    from torch import nn

    import opbridge.ops

    class EncoderAttention(nn.Module):
        def __init__(self, d_model=16, heads=2, levels=3, points=2):
            super().__init__()
            self.h, self.l, self.p, self.d = heads, levels, points, d_model
            self.sampling_offsets = nn.Linear(d_model, heads * levels * points * 2)
            self.attention_weights = nn.Linear(d_model, heads * levels * points)
            self.value_proj = nn.Linear(d_model, d_model)

        def forward(self, f0, f1, f2):
            feats = [f0, f1, f2]
            src = torch.cat([f.flatten(2).transpose(1, 2) for f in feats], 1)
            n, s, _ = src.shape
            spatial_shapes = spatial_shapes_from(feats)
            level_start_index = torch.cat((spatial_shapes.new_zeros((1,)), spatial_shapes.prod(1).cumsum(0)[:-1]))
            refs = []
            for f in feats:
                h, w = f.shape[-2:]
                ref_y, ref_x = torch.meshgrid(torch.arange(h, dtype=src.dtype) + 0.5,
                                              torch.arange(w, dtype=src.dtype) + 0.5, indexing="ij")
                refs.append(torch.stack((ref_x.reshape(-1) / w, ref_y.reshape(-1) / h), -1))
            reference_points = torch.cat(refs, 0)[None, :, None].expand(n, -1, self.l, 2)
            value = self.value_proj(src).view(n, s, self.h, self.d // self.h)
            offsets = self.sampling_offsets(src).view(n, s, self.h, self.l, self.p, 2)
            weights = self.attention_weights(src).view(n, s, self.h, self.l * self.p).softmax(-1)
            weights = weights.view(n, s, self.h, self.l, self.p)
            normalizer = torch.stack([spatial_shapes[..., 1], spatial_shapes[..., 0]], -1)
            loc = reference_points[:, :, None, :, None, :] + offsets / normalizer[None, None, None, :, None, :]
            return opbridge.ops.ms_deform_attn(value, spatial_shapes, level_start_index, loc, weights)

    return EncoderAttention


@pytest.mark.torch
@EXPORTERS
def test_export_dynamic_image_size(rng, dynamo):
    """spatial_shapes computed inside the graph: one exported model runs other image sizes (the
    node reads the level sizes at run time)."""
    import torch
    from torch.export import Dim

    if dynamo:
        # torch.as_tensor(list of sizes) would specialize them under torch.export (torch 2.13).
        def shapes_of(feats):
            return torch.stack([torch.tensor([f.shape[-2], f.shape[-1]]) for f in feats])
    else:
        # The TorchScript tracer records sizes as graph values only through tensor ops.
        def shapes_of(feats):
            return torch.stack([torch._shape_as_tensor(f)[-2:] for f in feats])

    torch.manual_seed(int(rng.integers(2**31)))
    model = _encoder_attention(shapes_of)().eval()
    feats = tuple(torch.randn(2, 16, h, w) for h, w in ((8, 10), (4, 5), (2, 3)))
    if dynamo:
        b = Dim("batch")
        kw = {"dynamic_shapes": tuple({0: b, 2: Dim(f"h{i}", min=2), 3: Dim(f"w{i}", min=2)} for i in range(3))}
    else:
        kw = {"dynamic_axes": {f"f{i}": {0: "batch", 2: f"h{i}", 3: f"w{i}"} for i in range(3)},
              "input_names": ["f0", "f1", "f2"]}
    proto = opbridge.onnx.export(model, feats, dynamo=dynamo, **kw)
    assert (opbridge.DOMAIN, "MultiScaleDeformableAttention") in _nodes(proto)
    sess = opbridge.InferenceSession(proto)
    for sizes in (((6, 9), (3, 5), (2, 2)), ((8, 10), (4, 5), (2, 3))):
        other = tuple(torch.randn(3, 16, h, w) for h, w in sizes)
        got = sess.run(None, {i.name: f.numpy() for i, f in zip(sess.get_inputs(), other)})[0]
        expect = model(*other).detach().numpy()
        np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-5)


@pytest.mark.torch
def test_torchscript_float64_grid_is_cast(rng):
    """Where the TorchScript exporter types the locations float64 while value is float32, the
    symbolic casts them to value's type (else the node would match no kernel). Simulated with a
    helper op that is the identity in torch and a Cast to double in the exported graph."""
    import torch

    import opbridge.ops

    if not hasattr(torch.ops.opbridge_test, "as_double_in_onnx"):
        op = torch.library.custom_op("opbridge_test::as_double_in_onnx", lambda x: x.clone(), mutates_args=(),
                                     schema="(Tensor x) -> Tensor")
        op.register_fake(lambda x: torch.empty_like(x))

    def symbolic(g, x):
        y = g.op("Cast", x, to_i=TensorProto.DOUBLE)
        y.setType(x.type().with_dtype(torch.float64))
        return y

    torch.onnx.register_custom_op_symbolic("opbridge_test::as_double_in_onnx", symbolic, 1)

    class Model(torch.nn.Module):
        def forward(self, value, spatial_shapes, level_start_index, loc, aw):
            loc = torch.ops.opbridge_test.as_double_in_onnx(loc)
            aw = torch.ops.opbridge_test.as_double_in_onnx(aw)
            return opbridge.ops.ms_deform_attn(value, spatial_shapes, level_start_index, loc, aw)

    args = make_inputs(rng, [(5, 4), (2, 2)], 2, 2, 4, 6, 2, "float32")
    proto = opbridge.onnx.export(Model().eval(), _torch(args), dynamo=False)
    casts = [n for n in proto.graph.node if n.op_type == "Cast"]
    assert [a.i for n in casts for a in n.attribute] == [TensorProto.DOUBLE] * 2 + [TensorProto.FLOAT] * 2
    sess = opbridge.InferenceSession(proto)
    got = sess.run(None, dict(zip([i.name for i in sess.get_inputs()], args)))[0]
    np.testing.assert_array_equal(got, Model()(*_torch(args)).numpy())


@pytest.mark.torch
@EXPORTERS
def test_domain_version_with_version_1_ops(rng, dynamo):
    """A model with GroupNorm (ai.opbridge 1) and MultiScaleDeformableAttention (since 2) imports
    ai.opbridge at 2 and runs; asking for version 1 explicitly is an error naming the op."""
    import torch

    import opbridge.ops

    class Model(torch.nn.Module):
        def forward(self, value, spatial_shapes, level_start_index, loc, aw):
            out = opbridge.ops.ms_deform_attn(value, spatial_shapes, level_start_index, loc, aw)
            return opbridge.ops.group_norm(out.transpose(1, 2), 2)

    args = _torch(make_inputs(rng, [(5, 4), (2, 2)], 2, 2, 4, 6, 2, "float32"))
    model = Model().eval()
    kw = {} if dynamo else {"input_names": NAMES}
    proto = opbridge.onnx.export(model, args, dynamo=dynamo, dynamic_batch=False, **kw)
    assert sorted(op for d, op in _nodes(proto) if d == opbridge.DOMAIN) == ["GroupNorm",
                                                                              "MultiScaleDeformableAttention"]
    assert _imports(proto)[opbridge.DOMAIN] == 2
    onnx.checker.check_model(proto, full_check=True)
    sess = opbridge.InferenceSession(proto)
    got = sess.run(None, {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)})[0]
    np.testing.assert_allclose(got, model(*args).numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(Exception, match=r"MultiScaleDeformableAttention node .* needs version 2"):
        opbridge.onnx.export(model, args, dynamo=dynamo, dynamic_batch=False, custom_opsets={opbridge.DOMAIN: 1},
                             **kw)


@pytest.mark.torch
def test_translation_table_with_torch_onnx_export(rng):
    """translation_table() with torch.onnx.export directly: the node comes out at version 2."""
    import torch

    import opbridge.onnx

    args = _torch(make_inputs(rng, [(5, 4), (1, 1)], 2, 2, 4, 6, 2, "float32"))
    program = torch.onnx.export(_attn_module(), args, dynamo=True,
                                custom_translation_table=opbridge.onnx.translation_table())
    proto = program.model_proto
    assert _imports(proto)[opbridge.DOMAIN] == 2
    sess = opbridge.InferenceSession(proto)
    got = sess.run(None, {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)})[0]
    np.testing.assert_array_equal(got, _attn_module()(*args).numpy())


# ---- the OpSchema (onnx only) -----------------------------------------------------------------------


def _schema_model(value=("N", 20, 4, 8), shapes=(3, 2), starts=(3,), loc=("N", "Lq", 4, 3, 2, 2),
                  aw=("N", "Lq", 4, 3, 2), elem=TensorProto.FLOAT):
    import opbridge.onnx  # noqa: F401  (registers the schemas)

    inputs = [helper.make_tensor_value_info("value", elem, list(value)),
              helper.make_tensor_value_info("spatial_shapes", TensorProto.INT64, list(shapes)),
              helper.make_tensor_value_info("level_start_index", TensorProto.INT64, list(starts)),
              helper.make_tensor_value_info("sampling_locations", elem, list(loc)),
              helper.make_tensor_value_info("attention_weights", elem, list(aw))]
    node = helper.make_node("MultiScaleDeformableAttention", NAMES, ["Y"], domain=opbridge.DOMAIN, name="attn")
    graph = helper.make_graph([node, helper.make_node("Relu", ["Y"], ["Z"])], "g", inputs,
                              [helper.make_tensor_value_info("Z", elem, [None, None, None])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(opbridge.DOMAIN, 2)],
                             ir_version=9)


def _dims(model, name):
    for vi in (*model.graph.value_info, *model.graph.output):
        if vi.name == name:
            return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
    return None


def test_schema_checker_and_shape_inference():
    import opbridge.onnx

    model = _schema_model()
    onnx.checker.check_model(model, full_check=True)
    inferred = opbridge.onnx.infer_shapes(model)
    assert _dims(inferred, "Y") == ["N", "Lq", 32]
    assert _dims(inferred, "Z") == ["N", "Lq", 32]  # propagated past our node


def test_schema_exists_since_domain_version_2():
    import opbridge.onnx  # noqa: F401

    assert not onnx.defs.has("MultiScaleDeformableAttention", 1, opbridge.DOMAIN)
    assert onnx.defs.get_schema("MultiScaleDeformableAttention", 2, opbridge.DOMAIN).since_version == 2
    assert onnx.defs.get_schema("MultiScaleDeformableAttention", 5, opbridge.DOMAIN).since_version == 2


@pytest.mark.parametrize("kwargs,message", [
    (dict(value=("N", 20, 4)), r"value must have rank 4 \(N, S, M, D\), got shape \[\?, 20, 4\]"),
    (dict(loc=("N", "Lq", 2, 3, 2, 2)), r"sampling_locations must have shape \(N, Lq, M, L, P, 2\) with N = "
                                        r"value.shape\[0\] = \?, M = value.shape\[2\] = 4"),
    (dict(shapes=(17, 2), starts=(17,), loc=("N", "Lq", 4, 17, 2, 2), aw=("N", "Lq", 4, 17, 2)),
     r"spatial_shapes must have between 1 and 16 rows \(one per level\), got 17"),
    (dict(aw=("N", "Lq", 4, 3, 3)), r"attention_weights must have shape \(N, Lq, M, L, P\)"),
    (dict(starts=(2,)), r"level_start_index must have L = 3 elements"),
], ids=["value-rank", "heads", "levels", "weights", "starts"])
def test_schema_shape_inference_rejects_invalid_nodes(kwargs, message):
    import opbridge.onnx  # noqa: F401  (registers the schemas)

    with pytest.raises(onnx.shape_inference.InferenceError, match=message):
        onnx.shape_inference.infer_shapes(_schema_model(**kwargs), strict_mode=True)


def test_check_lists_the_op_as_provided_by_opbridge():
    from opbridge._check import classify

    uses = classify(_schema_model(), ["CPUExecutionProvider"])
    ours = [u for u in uses if u.op_type == "MultiScaleDeformableAttention"]
    assert ours and ours[0].provider == "opbridge"
