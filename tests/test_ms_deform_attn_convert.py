"""opbridge.nn.convert on multi-scale deformable attention modules: transformers' (when installed),
and minimal stand-ins for mmcv's MultiScaleDeformableAttention and Deformable-DETR's MSDeformAttn
(neither installs here: mmcv has no wheel for this torch, Deformable-DETR is not on PyPI). The
stand-ins reproduce those classes' constructor, parameters and forward signature, with the
pure-PyTorch sampling core the libraries use as their reference; converted outputs are compared
with the unconverted module's in float64."""

from __future__ import annotations

import importlib
import warnings

import pytest

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import opbridge.nn  # noqa: E402

LEVELS = [(6, 5), (3, 4), (1, 1), (2, 3)]


def _core_pytorch(value, spatial_shapes, sampling_locations, attention_weights):
    """Deformable-DETR's ms_deform_attn_core_pytorch (= mmcv's multi_scale_deformable_attn_pytorch)."""
    N_, S_, M_, D_ = value.shape
    _, Lq_, M_, L_, P_, _ = sampling_locations.shape
    value_list = value.split([int(H_) * int(W_) for H_, W_ in spatial_shapes], dim=1)
    sampling_grids = 2 * sampling_locations - 1
    sampled = []
    for lid_, (H_, W_) in enumerate(spatial_shapes):
        value_l_ = value_list[lid_].flatten(2).transpose(1, 2).reshape(N_ * M_, D_, int(H_), int(W_))
        grid_l_ = sampling_grids[:, :, :, lid_].transpose(1, 2).flatten(0, 1)
        sampled.append(F.grid_sample(value_l_, grid_l_, mode="bilinear", padding_mode="zeros", align_corners=False))
    attention_weights = attention_weights.transpose(1, 2).reshape(N_ * M_, 1, Lq_, L_ * P_)
    output = (torch.stack(sampled, dim=-2).flatten(-2) * attention_weights).sum(-1).view(N_, M_ * D_, Lq_)
    return output.transpose(1, 2).contiguous()


class MSDeformAttn(nn.Module):
    """Deformable-DETR models/ops/modules/ms_deform_attn.py: constructor, parameters, forward."""

    def __init__(self, d_model=256, n_levels=4, n_heads=8, n_points=4):
        super().__init__()
        self.im2col_step = 64
        self.d_model, self.n_levels, self.n_heads, self.n_points = d_model, n_levels, n_heads, n_points
        self.sampling_offsets = nn.Linear(d_model, n_heads * n_levels * n_points * 2)
        self.attention_weights = nn.Linear(d_model, n_heads * n_levels * n_points)
        self.value_proj = nn.Linear(d_model, d_model)
        self.output_proj = nn.Linear(d_model, d_model)
        nn.init.uniform_(self.sampling_offsets.bias, -2.0, 2.0)  # spread the points (the real init does too)

    def forward(self, query, reference_points, input_flatten, input_spatial_shapes, input_level_start_index,
                input_padding_mask=None):
        N, Len_q, _ = query.shape
        N, Len_in, _ = input_flatten.shape
        assert (input_spatial_shapes[:, 0] * input_spatial_shapes[:, 1]).sum() == Len_in
        value = self.value_proj(input_flatten)
        if input_padding_mask is not None:
            value = value.masked_fill(input_padding_mask[..., None], float(0))
        value = value.view(N, Len_in, self.n_heads, self.d_model // self.n_heads)
        sampling_offsets = self.sampling_offsets(query).view(N, Len_q, self.n_heads, self.n_levels, self.n_points, 2)
        attention_weights = self.attention_weights(query).view(N, Len_q, self.n_heads, self.n_levels * self.n_points)
        attention_weights = F.softmax(attention_weights, -1).view(N, Len_q, self.n_heads, self.n_levels,
                                                                  self.n_points)
        if reference_points.shape[-1] == 2:
            offset_normalizer = torch.stack([input_spatial_shapes[..., 1], input_spatial_shapes[..., 0]], -1)
            sampling_locations = (reference_points[:, :, None, :, None, :]
                                  + sampling_offsets / offset_normalizer[None, None, None, :, None, :])
        else:
            sampling_locations = (reference_points[:, :, None, :, None, :2]
                                  + sampling_offsets / self.n_points * reference_points[:, :, None, :, None, 2:] * 0.5)
        output = _core_pytorch(value, input_spatial_shapes, sampling_locations, attention_weights)
        return self.output_proj(output)


class MultiScaleDeformableAttention(nn.Module):
    """mmcv.ops.multi_scale_deform_attn.MultiScaleDeformableAttention (a BaseModule there):
    constructor, parameters, forward (its CPU path, multi_scale_deformable_attn_pytorch)."""

    def __init__(self, embed_dims=256, num_heads=8, num_levels=4, num_points=4, im2col_step=64, dropout=0.1,
                 batch_first=False, norm_cfg=None, init_cfg=None, value_proj_ratio=1.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.batch_first = batch_first
        self.im2col_step = im2col_step
        self.embed_dims, self.num_levels, self.num_heads, self.num_points = embed_dims, num_levels, num_heads, num_points
        self.sampling_offsets = nn.Linear(embed_dims, num_heads * num_levels * num_points * 2)
        self.attention_weights = nn.Linear(embed_dims, num_heads * num_levels * num_points)
        value_proj_size = int(embed_dims * value_proj_ratio)
        self.value_proj = nn.Linear(embed_dims, value_proj_size)
        self.output_proj = nn.Linear(value_proj_size, embed_dims)
        nn.init.uniform_(self.sampling_offsets.bias, -2.0, 2.0)

    def forward(self, query, key=None, value=None, identity=None, query_pos=None, key_padding_mask=None,
                reference_points=None, spatial_shapes=None, level_start_index=None, **kwargs):
        if value is None:
            value = query
        if identity is None:
            identity = query
        if query_pos is not None:
            query = query + query_pos
        if not self.batch_first:
            query = query.permute(1, 0, 2)
            value = value.permute(1, 0, 2)
        bs, num_query, _ = query.shape
        bs, num_value, _ = value.shape
        assert (spatial_shapes[:, 0] * spatial_shapes[:, 1]).sum() == num_value
        value = self.value_proj(value)
        if key_padding_mask is not None:
            value = value.masked_fill(key_padding_mask[..., None], 0.0)
        value = value.view(bs, num_value, self.num_heads, -1)
        sampling_offsets = self.sampling_offsets(query).view(bs, num_query, self.num_heads, self.num_levels,
                                                             self.num_points, 2)
        attention_weights = self.attention_weights(query).view(bs, num_query, self.num_heads,
                                                               self.num_levels * self.num_points)
        attention_weights = attention_weights.softmax(-1)
        attention_weights = attention_weights.view(bs, num_query, self.num_heads, self.num_levels, self.num_points)
        if reference_points.shape[-1] == 2:
            offset_normalizer = torch.stack([spatial_shapes[..., 1], spatial_shapes[..., 0]], -1)
            sampling_locations = (reference_points[:, :, None, :, None, :]
                                  + sampling_offsets / offset_normalizer[None, None, None, :, None, :])
        else:
            sampling_locations = (reference_points[:, :, None, :, None, :2]
                                  + sampling_offsets / self.num_points * reference_points[:, :, None, :, None, 2:] * 0.5)
        output = _core_pytorch(value, spatial_shapes, sampling_locations, attention_weights)
        output = self.output_proj(output)
        if not self.batch_first:
            output = output.permute(1, 0, 2)
        return self.dropout(output) + identity


def _levels():
    shapes = torch.tensor(LEVELS, dtype=torch.long)
    start = torch.cat([shapes.new_zeros(1), shapes.prod(1).cumsum(0)[:-1]])
    return shapes, start, int(shapes.prod(1).sum())


def _reference_points(n, lq, coords):
    # Partly outside [0, 1]: the border taps must agree too.
    return torch.rand(n, lq, len(LEVELS), coords, dtype=torch.float64) * 1.2 - 0.1


def _state(m):
    return {k: v.clone() for k, v in m.state_dict().items()}


def _check_state_kept(before, model):
    after = model.state_dict()
    assert list(before) == list(after)
    for k in before:
        torch.testing.assert_close(after[k], before[k], rtol=0, atol=0)


@pytest.mark.parametrize("coords", [2, 4])
def test_msdeformattn(coords):
    m = MSDeformAttn(d_model=32, n_levels=len(LEVELS), n_heads=4, n_points=3).double().eval()
    shapes, start, s = _levels()
    query = torch.randn(2, 7, 32, dtype=torch.float64)
    flat = torch.randn(2, s, 32, dtype=torch.float64)
    mask = torch.rand(2, s) < 0.2
    ref = _reference_points(2, 7, coords)
    expected = m(query, ref, flat, shapes, start, mask)
    before = _state(m)
    holder = nn.Sequential(m)
    converted = opbridge.nn.convert(holder)
    assert converted is holder and type(holder[0]).__name__ == "MSDeformAttn" and holder[0] is not m
    assert type(holder[0]).__module__ == "opbridge.nn.ms_deform_attn"
    _check_state_kept(before, holder[0])
    torch.testing.assert_close(holder[0](query, ref, flat, shapes, start, mask), expected, rtol=1e-10, atol=1e-10)
    assert type(m) is MSDeformAttn  # the original class is untouched


@pytest.mark.parametrize("batch_first", [False, True])
def test_mmcv_multiscale_deformable_attention(batch_first):
    m = MultiScaleDeformableAttention(embed_dims=32, num_heads=4, num_levels=len(LEVELS), num_points=2,
                                      batch_first=batch_first).double().eval()
    shapes, start, s = _levels()
    query = torch.randn(2, 5, 32, dtype=torch.float64)
    value = torch.randn(2, s, 32, dtype=torch.float64)
    pos = torch.randn(2, 5, 32, dtype=torch.float64)
    if not batch_first:
        query, value, pos = query.transpose(0, 1), value.transpose(0, 1), pos.transpose(0, 1)
    ref = _reference_points(2, 5, 2)
    kwargs = dict(value=value, query_pos=pos, reference_points=ref, spatial_shapes=shapes, level_start_index=start)
    expected = m(query, **kwargs)
    before = _state(m)
    converted = opbridge.nn.convert(m)  # the model itself is the module: a new one comes back
    assert converted is not m
    _check_state_kept(before, converted)
    torch.testing.assert_close(converted(query, **kwargs), expected, rtol=1e-10, atol=1e-10)


def test_unknown_variant_named_in_one_warning():
    class MyDeformableAttention(nn.Module):
        def forward(self, x):
            return x

    class OtherMSDeformAttn(nn.Module):
        def forward(self, x):
            return x

    model = nn.Sequential(MyDeformableAttention(), OtherMSDeformAttn(), MyDeformableAttention(),
                          MSDeformAttn(d_model=16, n_levels=1, n_heads=2, n_points=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opbridge.nn.convert(model)
    messages = [str(w.message) for w in caught if "opbridge.nn.convert" in str(w.message)]
    assert len(messages) == 1
    assert "MyDeformableAttention" in messages[0] and "OtherMSDeformAttn" in messages[0]
    assert type(model[0]) is MyDeformableAttention and type(model[3]).__module__ == "opbridge.nn.ms_deform_attn"


def test_nothing_to_say_without_deformable_attention():
    model = nn.Sequential(nn.Linear(3, 3), nn.GroupNorm(1, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opbridge.nn.convert(model)


# --- transformers (optional) ---------------------------------------------------------------------

_HF_CORE_FAMILIES = ["deformable_detr", "grounding_dino", "mm_grounding_dino", "lw_detr", "omdet_turbo", "rf_detr",
                     "rt_detr", "pp_doclayout_v2", "pp_doclayout_v3", "pp_doclayout_v4"]


def _transformers_module(family):
    pytest.importorskip("transformers", reason="transformers is not installed (optional: pip install transformers)")
    try:
        return importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    except ImportError as e:  # pragma: no cover - older transformers without this family
        pytest.skip(f"transformers has no {family}: {e}")


def _msda_inputs(n=2, lq=9, m=4, d=8, p=3):
    shapes, start, s = _levels()
    value = torch.randn(n, s, m, d, dtype=torch.float64)
    loc = torch.rand(n, lq, m, len(LEVELS), p, 2, dtype=torch.float64) * 1.4 - 0.2
    weights = torch.rand(n, lq, m, len(LEVELS), p, dtype=torch.float64)
    return value, shapes, [tuple(map(int, r)) for r in shapes], start, loc, weights


@pytest.mark.parametrize("family", _HF_CORE_FAMILIES)
def test_transformers_core_module(family):
    mod = _transformers_module(family)
    forward_before = mod.MultiScaleDeformableAttention.forward
    core = mod.MultiScaleDeformableAttention()
    args = _msda_inputs()
    expected = core(*args, 64)
    holder = nn.ModuleDict({"attn": core})
    opbridge.nn.convert(holder)
    assert type(holder["attn"]).__module__ == "opbridge.nn.ms_deform_attn"
    torch.testing.assert_close(holder["attn"](*args, 64), expected, rtol=1e-10, atol=1e-10)
    assert mod.MultiScaleDeformableAttention.forward is forward_before  # no library patching
    assert core(*args, 64).equal(expected)  # the original module still computes as before


@pytest.mark.parametrize("family,cls", [("mask2former", "Mask2FormerPixelDecoderEncoderMultiscaleDeformableAttention"),
                                        ("oneformer", "OneFormerPixelDecoderEncoderMultiscaleDeformableAttention")])
@pytest.mark.parametrize("masked", [False, True])
def test_transformers_pixel_decoder_attention(family, cls, masked):
    mod = _transformers_module(family)
    function_before = mod.multi_scale_deformable_attention
    m = getattr(mod, cls)(embed_dim=32, num_heads=4, n_levels=len(LEVELS), n_points=2).double().eval()
    nn.init.uniform_(m.sampling_offsets.bias, -2.0, 2.0)
    shapes, start, s = _levels()
    hidden = torch.randn(2, s, 32, dtype=torch.float64)
    pos = torch.randn(2, s, 32, dtype=torch.float64)
    ref = _reference_points(2, s, 2)
    mask = (torch.rand(2, s) < 0.2) if masked else None
    kwargs = dict(attention_mask=mask, encoder_hidden_states=hidden, position_embeddings=pos, reference_points=ref,
                  spatial_shapes_list=[tuple(map(int, r)) for r in shapes], level_start_index=start)
    if family == "oneformer":
        kwargs["spatial_shapes"] = shapes
    expected = m(hidden, **kwargs)
    before = _state(m)
    holder = nn.ModuleList([m])
    opbridge.nn.convert(holder)
    assert type(holder[0]).__module__ == "opbridge.nn.ms_deform_attn"
    _check_state_kept(before, holder[0])
    got = holder[0](hidden, **kwargs)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)
    assert mod.multi_scale_deformable_attention is function_before


def test_transformers_v2_discrete_left_alone_with_warning():
    # The v2 form's "default" method is converted (tests/test_ms_deform_attn_v2.py); its
    # "discrete" one (nearest-pixel gather) is other arithmetic and stays.
    mod = _transformers_module("rt_detr_v2")
    cfg = importlib.import_module("transformers").RTDetrV2Config(d_model=32, decoder_attention_heads=4,
                                                                     decoder_n_points=2, decoder_method="discrete")
    model = nn.ModuleList([mod.RTDetrV2MultiscaleDeformableAttention(cfg)])
    with pytest.warns(UserWarning, match="RTDetrV2MultiscaleDeformableAttention"):
        opbridge.nn.convert(model)
    assert type(model[0]) is mod.RTDetrV2MultiscaleDeformableAttention


# --- a real model: transformers' DeformableDetr, random init, built from a config ----------------

def _tiny_deformable_detr():
    transformers = pytest.importorskip("transformers",
                                       reason="transformers is not installed (optional: pip install transformers)")
    backbone = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1],
                                         layer_type="basic", out_features=["stage2", "stage3", "stage4"])
    # decoder_layers >= 2: transformers' weight tying of the box heads needs a second layer.
    cfg = transformers.DeformableDetrConfig(
        backbone_config=backbone, use_timm_backbone=False, use_pretrained_backbone=False, d_model=32,
        encoder_layers=1, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=32, decoder_ffn_dim=32, num_queries=10, num_feature_levels=4, encoder_n_points=2,
        decoder_n_points=2, num_labels=3)
    detr = transformers.DeformableDetrForObjectDetection(cfg).eval()

    class Detector(nn.Module):
        def __init__(self):
            super().__init__()
            self.detr = detr

        def forward(self, pixel_values):
            out = self.detr(pixel_values=pixel_values)
            return out.logits, out.pred_boxes

    return Detector().eval()


def _converted_tiny_deformable_detr():
    model = _tiny_deformable_detr()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = model(x)
    before = _state(model)
    core = [n for n, m in model.named_modules() if type(m).__name__ == "MultiScaleDeformableAttention"]
    assert len(core) == 3  # 1 encoder + 2 decoder layers
    opbridge.nn.convert(model)
    _check_state_kept(before, model)
    assert all(type(model.get_submodule(n)).__module__ == "opbridge.nn.ms_deform_attn" for n in core)
    with torch.no_grad():
        got = model(x)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    return model, x


def test_deformable_detr_converted():
    _converted_tiny_deformable_detr()


# ~16 s (dynamo) + 2 s (TorchScript) on a 2-core machine; transformers is in the test requirements.
@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_deformable_detr_converted_export_ort(dynamo):
    import numpy as np

    model, x = _converted_tiny_deformable_detr()
    proto = opbridge.onnx.export(model, (x,), dynamo=dynamo)
    assert sum(n.op_type == "MultiScaleDeformableAttention" for n in proto.graph.node) == 3
    assert "GridSample" not in {n.op_type for n in proto.graph.node}
    sess = opbridge.InferenceSession(proto)
    x2 = torch.randn(2, 3, 64, 64)
    outs = sess.run(None, {sess.get_inputs()[0].name: x2.numpy()})
    with torch.no_grad():
        ref = model(x2)
    # End to end through ~20 float32 layers (ORT and torch order their sums differently): error
    # relative to the output's scale. (The TorchScript export's logits differ by ~2e-4 here, also
    # on the example input: float precision, not a traced constant.)
    for o, r in zip(outs, ref):
        r = r.numpy()
        assert o.shape == r.shape
        assert np.max(np.abs(o - r)) <= 1e-3 * max(1.0, float(np.max(np.abs(r))))
