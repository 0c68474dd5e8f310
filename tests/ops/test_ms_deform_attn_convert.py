"""opbridge.nn.convert on multi-scale deformable attention modules: transformers' (when installed),
and minimal stand-ins for mmcv's MultiScaleDeformableAttention and Deformable-DETR's MSDeformAttn
(neither installs here: mmcv has no wheel for this torch, Deformable-DETR is not on PyPI). The
stand-ins reproduce those classes' constructor, parameters and forward signature, with the
pure-PyTorch sampling core the libraries use as their reference; converted outputs are compared
with the unconverted module's in float64."""

from __future__ import annotations

import copy
import importlib
import pickle
import types
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
    # The v2 form's "default" method is converted (tests/ops/test_ms_deform_attn_v2.py); its
    # "discrete" one (nearest-pixel gather) is other arithmetic and stays.
    mod = _transformers_module("rt_detr_v2")
    cfg = importlib.import_module("transformers").RTDetrV2Config(d_model=32, decoder_attention_heads=4,
                                                                     decoder_n_points=2, decoder_method="discrete")
    model = nn.ModuleList([mod.RTDetrV2MultiscaleDeformableAttention(cfg)])
    with pytest.warns(UserWarning, match="RTDetrV2MultiscaleDeformableAttention"):
        opbridge.nn.convert(model)
    assert type(model[0]) is mod.RTDetrV2MultiscaleDeformableAttention


# --- transformers: the DeformableDetr-form layer (the whole layer is replaced) --------------------

def _layer(family, dtype=torch.float64, d_model=32, heads=4, points=3):
    """The family's ``*MultiscaleDeformableAttention`` layer; its constructor reads only these
    three config fields (checked for all ten families in transformers 5.23)."""
    mod = _transformers_module(family)
    cls = next(c for n, c in vars(mod).items()
               if n.endswith("MultiscaleDeformableAttention") and isinstance(c, type) and c.__module__ == mod.__name__)
    cfg = types.SimpleNamespace(d_model=d_model, num_feature_levels=len(LEVELS), disable_custom_kernels=True)
    layer = cls(cfg, num_heads=heads, n_points=points).to(dtype).eval()
    nn.init.uniform_(layer.sampling_offsets.bias, -2.0, 2.0)  # spread the points over several pixels
    return cls, layer


def _boxes(n, lq, levels, dtype):
    # (cx, cy, w, h): centres partly outside [0, 1], sizes in (0, 1].
    centres = torch.rand(n, lq, levels, 2, dtype=dtype) * 1.2 - 0.1
    return torch.cat([centres, torch.rand(n, lq, levels, 2, dtype=dtype) * 0.9 + 0.1], -1)


def _layer_inputs(reference, dtype=torch.float64, n=2, lq=7, d_model=32):
    """Keyword inputs of the layer as DeformableDetr's encoder / decoder call it. reference:
    "points" (N, Lq, L, 2), "boxes" (N, Lq, L, 4) or "boxes, one level" (N, Lq, 1, 4, as
    RT-DETR's decoder passes them, broadcast over the levels)."""
    shapes, start, s = _levels()
    if reference == "points":
        ref = _reference_points(n, lq, 2).to(dtype)
    else:
        ref = _boxes(n, lq, len(LEVELS) if reference == "boxes" else 1, dtype)
    return dict(hidden_states=torch.randn(n, lq, d_model, dtype=dtype),
                attention_mask=torch.rand(n, s) > 0.2,  # True where valid (the layer inverts it)
                encoder_hidden_states=torch.randn(n, s, d_model, dtype=dtype),
                position_embeddings=torch.randn(n, lq, d_model, dtype=dtype), reference_points=ref,
                spatial_shapes=shapes, spatial_shapes_list=[tuple(map(int, r)) for r in shapes],
                level_start_index=start)


REFERENCES = ["points", "boxes", "boxes, one level"]


@pytest.mark.parametrize("reference", REFERENCES)
@pytest.mark.parametrize("family", _HF_CORE_FAMILIES)
def test_transformers_layer(family, reference):
    """The whole layer is replaced (not only its core module): same results as the original in
    float64 (locations from non-power-of-two level sizes), same state, still an instance of the
    original class (transformers records attentions by isinstance), both return values."""
    cls, layer = _layer(family)
    forward_before = cls.forward
    kwargs = _layer_inputs(reference)
    expected = layer(**kwargs)
    before = _state(layer)
    holder = nn.ModuleDict({"encoder_attn": layer})
    opbridge.nn.convert(holder)
    new = holder["encoder_attn"]
    assert isinstance(new, cls) and new is not layer and type(new).__module__ == "opbridge.nn.ms_deform_attn"
    assert new.attn is layer.attn  # the core module is kept (unused), as are all submodules
    _check_state_kept(before, new)
    got = new(**kwargs)
    assert isinstance(got, tuple) and len(got) == 2
    torch.testing.assert_close(got[0], expected[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got[1], expected[1], rtol=0, atol=0)  # attention weights: the same ops
    assert cls.forward is forward_before and type(layer) is cls  # no library patching
    assert layer(**kwargs)[0].equal(expected[0])


@pytest.mark.parametrize("reference", REFERENCES)
@pytest.mark.parametrize("family", ["deformable_detr", "grounding_dino"])
def test_transformers_layer_bit_identical_in_float32(family, reference):
    """Against the original forward with only its core module swapped for opbridge's (so both call
    the same deterministic kernel): bit-identical in float32. The level sizes 5, 6, 3, 4, 1, 2 make
    1/W and 1/H inexact: locations computed as offsets * (1/W) instead of offsets / W, or in another
    order, differ in the last bit and fail this."""
    cls, layer = _layer(family, torch.float32)
    reference_model = copy.deepcopy(layer)
    reference_model.attn = opbridge.nn.ms_deform_attn.TransformersMultiScaleDeformableAttention()
    kwargs = _layer_inputs(reference, torch.float32)
    holder = nn.ModuleList([layer])
    opbridge.nn.convert(holder)
    assert isinstance(holder[0], opbridge.nn.ms_deform_attn.TransformersDeformableAttentionLayer)
    got, expected = holder[0](**kwargs), reference_model(**kwargs)
    assert got[0].equal(expected[0]) and got[1].equal(expected[1])


@pytest.mark.parametrize("reference", ["points", "boxes", "boxes, one level", "points, one level"])
@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.float64, torch.float64),
                                    (torch.float16, torch.float32), (torch.float32, torch.float64)],
                         ids=["f32", "f64", "f16-offsets-f32-refs", "f32-offsets-f64-refs"])
def test_sampling_locations_bit_identical(reference, dtypes):
    """The flat-layout locations are exactly the originals' broadcast expression, also with mixed
    types (autocast: 16-bit offsets, float32 references) and references shared by all levels."""
    from opbridge.nn.ms_deform_attn import _sampling_locations

    off_t, ref_t = dtypes
    n, lq, m, levels, p = 2, 9, 3, 4, 5
    shapes = torch.tensor([[5, 7], [3, 6], [1, 1], [9, 2]])
    offsets = (torch.randn(n, lq, m, levels, p, 2, dtype=torch.float64) * 3).to(off_t)
    ref_levels = 1 if reference.endswith("one level") else levels
    ref = (_boxes(n, lq, ref_levels, torch.float64) if reference.startswith("boxes")
           else torch.rand(n, lq, ref_levels, 2, dtype=torch.float64)).to(ref_t)
    normalizer = torch.stack([shapes[..., 1], shapes[..., 0]], -1)
    if ref.shape[-1] == 2:
        expected = ref[:, :, None, :, None, :] + offsets / normalizer[None, None, None, :, None, :]
    else:
        expected = ref[:, :, None, :, None, :2] + offsets / p * ref[:, :, None, :, None, 2:] * 0.5
    got = _sampling_locations(ref, offsets, normalizer, p)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.equal(expected)
    with pytest.raises(ValueError, match="Last dim of reference_points must be 2 or 4, but got 3"):
        _sampling_locations(torch.cat([ref[..., :2], ref[..., :1]], -1), offsets, normalizer, p)


@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("reference", REFERENCES)
def test_transformers_layer_gradients(reference, masked):
    """Training through a converted layer: the same gradients (parameters, queries, values,
    reference points) as the original, in float64."""
    _, layer = _layer("deformable_detr")
    kwargs = _layer_inputs(reference)
    if not masked:
        kwargs["attention_mask"] = None
    leaves = {k: kwargs[k].requires_grad_() for k in ("hidden_states", "encoder_hidden_states", "reference_points")}
    probe = torch.randn_like(layer(**kwargs)[1])

    def grads(model):
        out, weights = model(**kwargs)
        names = [n for n, _ in model.named_parameters()]
        params = [p for _, p in model.named_parameters()]
        g = torch.autograd.grad((out * out).sum() + (weights * probe).sum(), params + list(leaves.values()))
        return dict(zip(names + list(leaves), g))

    expected = grads(layer)
    holder = nn.ModuleList([layer])
    opbridge.nn.convert(holder)
    assert isinstance(holder[0], opbridge.nn.ms_deform_attn.TransformersDeformableAttentionLayer)
    got = grads(holder[0])
    assert got.keys() == expected.keys()
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=1e-9, atol=1e-9, msg=lambda m, k=k: f"{k}: {m}")


def test_transformers_layer_hooks_and_copies():
    """Hooks on the layer keep running; a hook on its core module keeps the layer (only the core
    module is replaced, so the hook still runs); converted layers deepcopy and pickle."""
    cls, layer = _layer("deformable_detr")
    kwargs = _layer_inputs("points")
    expected = layer(**kwargs)
    holder = nn.ModuleList([layer])
    opbridge.nn.convert(holder)
    for clone in (copy.deepcopy(holder[0]), pickle.loads(pickle.dumps(holder[0]))):
        assert type(clone) is type(holder[0]) and isinstance(clone, cls)
        torch.testing.assert_close(clone(**kwargs)[0], expected[0], rtol=1e-10, atol=1e-10)

    calls = []
    _, hooked = _layer("deformable_detr")
    hooked.register_forward_hook(lambda mod, args, out: calls.append("layer"))
    holder = nn.ModuleList([hooked])
    opbridge.nn.convert(holder)
    assert isinstance(holder[0], opbridge.nn.ms_deform_attn.TransformersDeformableAttentionLayer)
    holder[0](**kwargs)
    assert calls == ["layer"]
    # A hook on value_proj sees its output as it was made (the masking does not write into it).
    kept = []
    hooked.value_proj.register_forward_hook(lambda mod, args, out: kept.append(out))
    holder[0](**kwargs)
    assert kept[0].equal(hooked.value_proj(kwargs["encoder_hidden_states"]))

    _, observed = _layer("deformable_detr")
    observed.attn.register_forward_pre_hook(lambda mod, args: calls.append("attn"))
    holder = nn.ModuleList([observed])
    opbridge.nn.convert(holder)
    assert type(holder[0]) is type(observed)
    assert type(holder[0].attn) is opbridge.nn.ms_deform_attn.TransformersMultiScaleDeformableAttention
    holder[0](**kwargs)
    assert calls[-1] == "attn"


def _recording_op(monkeypatch):
    """Replaces opbridge.ops.ms_deform_attn (what the drop-ins call) by a recorder of the level
    tables it is handed."""
    real, seen = opbridge.ops.ms_deform_attn, []

    def record(value, spatial_shapes, level_start_index, *rest):
        seen.append((spatial_shapes, level_start_index))
        return real(value, spatial_shapes, level_start_index, *rest)

    monkeypatch.setattr(opbridge.ops, "ms_deform_attn", record)
    return seen


@pytest.mark.parametrize("module", ["layer", "core"])
def test_transformers_op_gets_host_tables_from_the_sizes_list(monkeypatch, module):
    """transformers passes the level sizes twice: spatial_shapes on the model's device and
    spatial_shapes_list as ints. The op is handed tables built from the ints in host memory (a
    device tensor would cost a copy and a synchronization per call on CUDA), the same objects on
    every call with that layout; results unchanged. (On a GPU, test_cuda's
    test_transformers_layer_cuda_never_synchronizes checks the synchronization itself.)"""
    _, layer = _layer("deformable_detr")
    kwargs = _layer_inputs("points")
    expected = layer(**kwargs)[0]
    holder = nn.ModuleDict({"a": layer})
    opbridge.nn.convert(holder)
    seen = _recording_op(monkeypatch)
    if module == "layer":
        calls = [lambda: holder["a"](**kwargs)[0]] * 2
        model_shapes = kwargs["spatial_shapes"]
    else:
        core = layer.attn  # the original core module
        converted = nn.ModuleDict({"attn": copy.deepcopy(core)})
        opbridge.nn.convert(converted)
        args = _msda_inputs()
        calls = [lambda: converted["attn"](*args, 64)] * 2
        expected = core(*args, 64)
        model_shapes = args[1]
    for call in calls:
        torch.testing.assert_close(call(), expected, rtol=1e-10, atol=1e-10)
    (shapes, starts), (shapes2, starts2) = seen
    assert shapes is shapes2 and starts is starts2  # cached per level layout
    assert shapes.device.type == "cpu" and starts.device.type == "cpu"
    assert shapes.tolist() == [list(r) for r in LEVELS] and starts.tolist() == _levels()[1].tolist()
    assert shapes is not model_shapes


def test_transformers_layer_checks_the_levels_like_the_original():
    _, layer = _layer("deformable_detr")
    kwargs = _layer_inputs("points")
    kwargs["spatial_shapes_list"] = kwargs["spatial_shapes_list"][:-1]  # sizes no longer add up to S
    with pytest.raises(ValueError, match="Make sure to align the spatial shapes"):
        layer(**kwargs)
    holder = nn.ModuleList([layer])
    opbridge.nn.convert(holder)
    with pytest.raises(ValueError, match="Make sure to align the spatial shapes"):
        holder[0](**kwargs)


def test_transformers_layer_of_another_form_keeps_its_forward():
    """A layer whose forward differs from DeformableDetr's in its arithmetic (here: the mask not
    inverted) has the same name, attributes and parameters but is not replaced as a whole: only
    its core module is."""
    mod = _transformers_module("deformable_detr")

    class MaskedDeformableDetrMultiscaleDeformableAttention(mod.DeformableDetrMultiscaleDeformableAttention):
        def forward(self, hidden_states, attention_mask=None, encoder_hidden_states=None,
                    encoder_attention_mask=None, position_embeddings=None, reference_points=None,
                    spatial_shapes=None, spatial_shapes_list=None, level_start_index=None, **kwargs):
            mask = None if attention_mask is None else ~attention_mask
            return super().forward(hidden_states, mask, encoder_hidden_states, encoder_attention_mask,
                                   position_embeddings, reference_points, spatial_shapes, spatial_shapes_list,
                                   level_start_index)

    _, base = _layer("deformable_detr")
    layer = MaskedDeformableDetrMultiscaleDeformableAttention.__new__(MaskedDeformableDetrMultiscaleDeformableAttention)
    layer.__dict__.update(base.__dict__)
    kwargs = _layer_inputs("points")
    expected = layer(**kwargs)
    holder = nn.ModuleList([layer])
    opbridge.nn.convert(holder)
    assert type(holder[0]) is MaskedDeformableDetrMultiscaleDeformableAttention
    assert type(holder[0].attn) is opbridge.nn.ms_deform_attn.TransformersMultiScaleDeformableAttention
    torch.testing.assert_close(holder[0](**kwargs)[0], expected[0], rtol=1e-10, atol=1e-10)


class _LayerCall(nn.Module):
    """A converted layer with tensor inputs only: spatial_shapes and level_start_index are inputs
    (no Python list), so batch, query count and the level sizes may all change at run time."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, hidden_states, encoder_hidden_states, reference_points, attention_mask, spatial_shapes,
                level_start_index):
        return self.layer(hidden_states, attention_mask, encoder_hidden_states, None, None, reference_points,
                          spatial_shapes, None, level_start_index)


_LAYER_INPUTS = ["hidden_states", "encoder_hidden_states", "reference_points", "attention_mask", "spatial_shapes",
                 "level_start_index"]


def _layer_call_inputs(reference, n, lq, levels):
    shapes = torch.tensor(levels, dtype=torch.long)
    start = torch.cat([shapes.new_zeros(1), shapes.prod(1).cumsum(0)[:-1]])
    s = int(shapes.prod(1).sum())
    ref = torch.rand(n, lq, len(levels), 2) * 1.2 - 0.1 if reference == "points" else _boxes(n, lq, len(levels),
                                                                                             torch.float32)
    return (torch.randn(n, lq, 32), torch.randn(n, s, 32), ref, torch.rand(n, s) > 0.2, shapes, start)


def _converted_layer_call():
    _, layer = _layer("deformable_detr", torch.float32)
    model = _LayerCall(layer).eval()
    opbridge.nn.convert(model)
    assert isinstance(model.layer, opbridge.nn.ms_deform_attn.TransformersDeformableAttentionLayer)
    return model


OTHER_LEVELS = [(7, 3), (5, 5), (2, 1), (3, 2)]  # other level sizes (and S) than LEVELS


@pytest.mark.parametrize("reference", ["points", "boxes"])
def test_transformers_layer_torch_export_dynamic(reference):
    """torch.export with dynamic batch, query count and sequence length: the flat-layout arithmetic
    (expand, flatten, addcdiv) keeps them symbolic; the program runs other sizes and level shapes."""
    from torch.export import Dim

    model = _converted_layer_call()
    args = _layer_call_inputs(reference, 2, 7, LEVELS)
    b, q, s = Dim("batch"), Dim("queries"), Dim("seq")
    program = torch.export.export(model, args, dynamic_shapes=({0: b, 1: q}, {0: b, 1: s}, {0: b, 1: q},
                                                                {0: b, 1: s}, None, None))
    for other in (_layer_call_inputs(reference, 3, 11, OTHER_LEVELS), args):
        got, expected = program.module()(*other), model(*other)
        assert got[0].equal(expected[0]) and got[1].equal(expected[1])


# The dynamo exporter notes that the Dims it was given are named as given (torch 2.13); the
# TorchScript tracer notes that the number of coordinates is read as a constant (it is one).
@pytest.mark.filterwarnings("ignore:# The axis name:UserWarning", "ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize("lowering", ["custom", "standard"])
@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
@pytest.mark.parametrize("reference", ["points", "boxes"])
def test_transformers_layer_onnx_export(dynamo, lowering, reference):
    """opbridge.onnx.export of a converted layer with both exporters and both lowerings; ORT runs
    another batch, query count, sequence length and other level sizes, and agrees with torch."""
    import numpy as np
    import onnx

    import opbridge.onnx

    model = _converted_layer_call()
    args = _layer_call_inputs(reference, 2, 7, LEVELS)
    names = ["output", "attention_weights"]
    if dynamo:
        from torch.export import Dim

        b, q, s = Dim("batch"), Dim("queries"), Dim("seq")
        kw = dict(dynamic_shapes=({0: b, 1: q}, {0: b, 1: s}, {0: b, 1: q}, {0: b, 1: s}, None, None))
    else:
        axes = {"hidden_states": {0: "batch", 1: "queries"}, "encoder_hidden_states": {0: "batch", 1: "seq"},
                "reference_points": {0: "batch", 1: "queries"}, "attention_mask": {0: "batch", 1: "seq"}}
        kw = dict(dynamic_axes=axes, input_names=_LAYER_INPUTS)
    proto = opbridge.onnx.export(model, args, dynamo=dynamo, lowering=lowering, output_names=names, **kw)
    ops_used = {n.op_type for n in proto.graph.node}
    assert ("MultiScaleDeformableAttention" in ops_used) == (lowering == "custom")
    assert ("GridSample" in ops_used) == (lowering == "standard")
    if lowering == "standard":
        import onnxruntime as ort

        onnx.checker.check_model(proto)
        sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    else:
        sess = opbridge.InferenceSession(proto)
    feeds = {i.name for i in sess.get_inputs()}
    for other in (_layer_call_inputs(reference, 3, 11, OTHER_LEVELS), args):
        got = sess.run(None, {k: v.numpy() for k, v in zip(_LAYER_INPUTS, other) if k in feeds})
        with torch.no_grad():
            expected = [t.numpy() for t in model(*other)]
        for g, e in zip(got, expected):
            assert g.shape == e.shape
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


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
    # The layers that hold the core modules are replaced as a whole.
    layers = [model.get_submodule(n.rpartition(".")[0]) for n in core]
    assert all(isinstance(m, opbridge.nn.ms_deform_attn.TransformersDeformableAttentionLayer) for m in layers)
    with torch.no_grad():
        got = model(x)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    return model, x


def test_deformable_detr_converted():
    _converted_tiny_deformable_detr()


def test_deformable_detr_converted_records_attentions():
    """output_attentions still returns the deformable layers' attention weights. transformers
    installs its recording hooks at the first call, on the layers that are instances of the
    original class: a model converted before its first call relies on the replacement being one;
    one converted after it keeps the hooks (they live in the shared __dict__)."""
    model = _tiny_deformable_detr().detr
    fresh = copy.deepcopy(model)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = model(pixel_values=x, output_attentions=True)
        opbridge.nn.convert(model)
        opbridge.nn.convert(fresh)
        for converted in (model, fresh):
            got = converted(pixel_values=x, output_attentions=True)
            for name in ("encoder_attentions", "cross_attentions"):
                assert len(getattr(got, name)) == len(getattr(expected, name)) > 0
                for g, e in zip(getattr(got, name), getattr(expected, name)):
                    torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


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
