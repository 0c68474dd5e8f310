"""Models with multi-scale deformable attention, built from configs with random init (no
download), and their plain exports (no opbridge): what `opbridge optimize` is given. Shared by
tests/optimize/test_optimize_msda.py and bench_msda_optimize.py.

FAMILIES maps a name to a builder returning a `Built`: the model (tensors in, tensors out), example
inputs, input names, which input axes may be dynamic, and how many deformable-attention modules it
has (the number of chains a rewrite must find).

transformers' families: Deformable DETR, RT-DETR (v1, v2), D-FINE, Grounding DINO, Mask2Former,
OneFormer (its pixel decoder: the whole model needs a tokenizer's task inputs). Two more are
re-implementations, labelled as such, because the libraries do not install here (mmcv has no
wheel for this torch; Ultralytics' package pulls OpenCV and more): `mmcv_fallback` is a decoder
layer around mmcv's `multi_scale_deformable_attn_pytorch` as mmcv writes it, `ultralytics_rtdetr`
Ultralytics' `MSDeformAttn` (its `multi_scale_deformable_attn_pytorch`, `value_shapes` as a
list of (H, W), 2- and 4-coordinate references), exported as each library exports (Ultralytics:
the TorchScript exporter).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import warnings
from typing import Any, Callable
from unittest import mock


def _torch():
    import torch

    return torch


@dataclasses.dataclass
class Built:
    model: Any
    inputs: tuple
    names: list
    dynamic: dict  # input name -> {axis: symbolic name}
    modules: int  # deformable-attention modules in the model
    # What the export needs patched that torch's exporters cannot export (the model itself runs unpatched).
    export_patch: Callable[[], Any] = contextlib.nullcontext


def _scale_init(detr) -> None:
    """The configs' initializer_range (0.01) shrinks every tiny layer's output ~10x, so that the
    deformable attention would sample values ~1e-14: scaled init keeps them O(1) (the attention
    layers keep their own init, their point grid)."""
    nn = _torch().nn
    for name, m in detr.named_modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            m.reset_parameters()
        elif isinstance(m, nn.Linear) and not any(k in name for k in ("sampling_offsets", "attention_weights")):
            nn.init.normal_(m.weight, std=m.in_features ** -0.5)


def _resnet(transformers, widths=(8, 16, 24, 32)):
    return transformers.ResNetConfig(embedding_size=widths[0], hidden_sizes=list(widths), depths=[1, 1, 1, 1],
                                     layer_type="basic", out_features=["stage2", "stage3", "stage4"])


def _detector(detr, outputs: Callable) -> Any:
    torch = _torch()

    class Detector(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.detr = detr

        def forward(self, pixel_values):
            return outputs(self.detr(pixel_values=pixel_values))

    return Detector().eval()


def _count(model) -> int:
    names = ("MultiScaleDeformableAttention", "MultiscaleDeformableAttention", "MSDeformAttn")
    return sum(1 for m in model.modules() if any(type(m).__name__.endswith(n) for n in names)
               and hasattr(m, "sampling_offsets"))


def _image_input(batch: int, height: int, width: int):
    torch = _torch()
    return torch.randn(batch, 3, height, width)


_IMAGE_AXES = {"pixel_values": {0: "batch", 2: "height", 3: "width"}}


def deformable_detr(batch=1, height=96, width=128) -> Built:
    import transformers

    cfg = transformers.DeformableDetrConfig(
        backbone_config=_resnet(transformers), use_timm_backbone=False, use_pretrained_backbone=False, d_model=32,
        encoder_layers=1, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=32, decoder_ffn_dim=32, num_queries=10, num_feature_levels=4, encoder_n_points=2,
        decoder_n_points=2, num_labels=3)
    detr = transformers.DeformableDetrForObjectDetection(cfg).eval()
    model = _detector(detr, lambda o: (o.logits, o.pred_boxes))
    return Built(model, (_image_input(batch, height, width),), ["pixel_values"], _IMAGE_AXES, _count(model))


def rt_detr(batch=1, height=96, width=128) -> Built:
    import transformers

    backbone = transformers.RTDetrResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1],
                                               layer_type="basic", out_features=["stage2", "stage3", "stage4"])
    cfg = transformers.RTDetrConfig(
        backbone_config=backbone, encoder_hidden_dim=32, encoder_in_channels=[32, 48, 64], encoder_ffn_dim=32,
        encoder_attention_heads=4, d_model=32, decoder_in_channels=[32, 32, 32], decoder_ffn_dim=32, decoder_layers=2,
        decoder_attention_heads=4, decoder_n_points=2, num_queries=10, num_denoising=0, num_labels=3,
        hidden_expansion=0.5, freeze_backbone_batch_norms=False)
    detr = transformers.RTDetrForObjectDetection(cfg).eval()
    _scale_init(detr)
    model = _detector(detr, lambda o: (o.logits, o.pred_boxes))
    return Built(model, (_image_input(batch, height, width),), ["pixel_values"], _IMAGE_AXES, _count(model))


def rt_detr_v2(batch=1, height=96, width=128) -> Built:
    import transformers

    cfg = transformers.RTDetrV2Config(
        backbone_config=_resnet(transformers), encoder_hidden_dim=32, encoder_in_channels=[16, 24, 32],
        encoder_ffn_dim=32, encoder_attention_heads=4, d_model=32, decoder_in_channels=[32, 32, 32],
        decoder_ffn_dim=32, decoder_layers=2, decoder_attention_heads=4, decoder_n_points=3, num_queries=10,
        num_denoising=0, num_labels=3, hidden_expansion=0.5, freeze_backbone_batch_norms=False)
    detr = transformers.RTDetrV2ForObjectDetection(cfg).eval()
    _scale_init(detr)
    model = _detector(detr, lambda o: (o.logits, o.pred_boxes))
    return Built(model, (_image_input(batch, height, width),), ["pixel_values"], _IMAGE_AXES, _count(model))


def d_fine(batch=1, height=96, width=128, points=(3, 3, 3)) -> Built:
    import transformers

    backbone = transformers.HGNetV2Config(
        embedding_size=8, depths=[1, 1, 1, 1], hidden_sizes=[16, 24, 32, 48], stem_channels=[3, 8, 8],
        stage_in_channels=[8, 16, 24, 32], stage_mid_channels=[8, 8, 8, 8], stage_out_channels=[16, 24, 32, 48],
        stage_num_blocks=[1, 1, 1, 1], stage_numb_of_layers=[1, 1, 1, 1], out_features=["stage2", "stage3", "stage4"])
    cfg = transformers.DFineConfig(
        backbone_config=backbone, encoder_hidden_dim=32, encoder_in_channels=[24, 32, 48], encoder_ffn_dim=32,
        encoder_attention_heads=4, d_model=32, decoder_in_channels=[32, 32, 32], decoder_ffn_dim=32, decoder_layers=2,
        decoder_attention_heads=4, decoder_n_points=list(points), num_queries=10, num_denoising=0, num_labels=3,
        lqe_hidden_dim=8, hidden_expansion=0.5, depth_mult=0.34, freeze_backbone_batch_norms=False)
    detr = transformers.DFineForObjectDetection(cfg).eval()
    _scale_init(detr)
    model = _detector(detr, lambda o: (o.logits, o.pred_boxes))
    return Built(model, (_image_input(batch, height, width),), ["pixel_values"], _IMAGE_AXES, _count(model))


def _text_masks(input_ids, special_tokens):
    """transformers' ``generate_masks_with_special_tokens_and_transfer_map`` (Grounding DINO's
    phrase masks) without ``torch.isin``, ``cummax`` and ``cummin``, which neither torch exporter
    exports, and without a boolean ``torch.eye``, which ORT cannot run: the same values from
    comparisons over (token, token) pairs."""
    torch = _torch()
    batch, n = input_ids.shape
    special = (input_ids[..., None] == special_tokens).any(-1)  # (B, N)
    idx = torch.arange(n, device=input_ids.device)
    before = idx[None, :] <= idx[:, None]  # [i, j]: j <= i
    prev = torch.where(before[None] & special[:, None, :], idx[None, None, :], -1).amax(-1)
    prev = torch.cat([prev.new_full((batch, 1), -1), prev[:, :-1]], dim=1)
    nxt = torch.where(~before[None] | (idx[None, :] == idx[:, None])[None], idx[None, None, :], n)
    nxt = torch.where(special[:, None, :], nxt, n).amin(-1)
    valid = (nxt != 0) & (nxt != n - 1) & (nxt != n)
    mask = (nxt.unsqueeze(2) == nxt.unsqueeze(1)) & valid.unsqueeze(1)
    mask = (idx[:, None] == idx[None, :])[None] | mask  # a bool EyeLike has no ORT kernel
    position_ids = idx[None, :] - prev - 1
    position_ids = torch.where(valid, position_ids, torch.zeros_like(position_ids))
    return mask, torch.clamp(position_ids, min=0).to(torch.long)


def grounding_dino(batch=1, height=96, width=128) -> Built:
    import transformers

    torch = _torch()
    text = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32, max_position_embeddings=32)
    cfg = transformers.GroundingDinoConfig(
        backbone_config=_resnet(transformers), text_config=text, d_model=32, encoder_layers=1, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32,
        num_queries=10, num_feature_levels=4, encoder_n_points=2, decoder_n_points=2, max_text_len=16)
    detr = transformers.GroundingDinoForObjectDetection(cfg).eval()

    class Grounding(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.detr = detr

        def forward(self, pixel_values, input_ids):
            out = self.detr(pixel_values=pixel_values, input_ids=input_ids)
            return out.logits, out.pred_boxes

    model = Grounding().eval()
    ids = torch.randint(1, 64, (batch, 8))
    axes = dict(_IMAGE_AXES, input_ids={0: "batch"})
    from transformers.models.grounding_dino import modeling_grounding_dino as mod

    def patch():
        return mock.patch.object(mod, "generate_masks_with_special_tokens_and_transfer_map", _text_masks)

    return Built(model, (_image_input(batch, height, width), ids), ["pixel_values", "input_ids"], axes, _count(model),
                 export_patch=patch)


def mask2former(batch=1, height=96, width=128) -> Built:
    import transformers

    cfg = transformers.Mask2FormerConfig(
        backbone_config=transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1],
                                                  layer_type="basic",
                                                  out_features=["stage1", "stage2", "stage3", "stage4"]),
        feature_size=32, mask_feature_size=32, hidden_dim=32, encoder_feedforward_dim=32, encoder_layers=2,
        decoder_layers=2, num_attention_heads=4, dim_feedforward=32, num_queries=10, num_labels=3)
    # The model without its segmentation head (whose loss needs scipy): the pixel decoder holds the
    # deformable attention.
    net = transformers.Mask2FormerModel(cfg).eval()
    model = _detector(net, lambda o: (o.pixel_decoder_last_hidden_state, o.transformer_decoder_last_hidden_state))
    return Built(model, (_image_input(batch, height, width),), ["pixel_values"], _IMAGE_AXES, _count(model))


def oneformer_pixel_decoder(batch=1, height=96, width=128) -> Built:
    """OneFormer's pixel decoder (its deformable-attention encoder) on backbone-like features: the
    whole model needs text task inputs from a tokenizer."""
    import transformers
    from transformers.models.oneformer import modeling_oneformer as mod

    torch = _torch()
    cfg = transformers.OneFormerConfig(
        backbone_config=_resnet(transformers), conv_dim=32, mask_dim=32, hidden_dim=32, encoder_feedforward_dim=32,
        encoder_layers=2, num_attention_heads=4, dim_feedforward=32, num_queries=10, num_labels=3)
    channels = [8, 16, 24, 32]
    decoder = mod.OneFormerPixelDecoder(cfg, feature_channels=channels).eval()
    # Built outside a PreTrainedModel, the decoder is not initialized by transformers: its
    # level_embed (torch.Tensor(...)) would hold whatever memory it got, at times 1e30.
    torch.nn.init.normal_(decoder.level_embed)

    class PixelDecoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.decoder = decoder

        def forward(self, f1, f2, f3, f4):
            out = self.decoder([f1, f2, f3, f4])
            return out.mask_features, *out.multi_scale_features

    feats = tuple(torch.randn(batch, c, height // s, width // s) for c, s in zip(channels, (4, 8, 16, 32)))
    names = ["f1", "f2", "f3", "f4"]
    axes = {n: {0: "batch", 2: f"h{i}", 3: f"w{i}"} for i, n in enumerate(names)}
    model = PixelDecoder().eval()
    return Built(model, feats, names, axes, _count(model))


# --- re-implementations of libraries that do not install here ------------------------------------


def _ms_deform_attn_pytorch(value, value_spatial_shapes, sampling_locations, attention_weights):
    """A re-implementation of mmcv's (and Ultralytics') `multi_scale_deformable_attn_pytorch`
    (mmcv/ops/multi_scale_deform_attn.py; ultralytics/nn/modules/utils.py): the same operations in
    the same order."""
    torch = _torch()
    F = torch.nn.functional
    bs, _, num_heads, embed_dims = value.shape
    _, num_queries, num_heads, num_levels, num_points, _ = sampling_locations.shape
    value_list = value.split([H_ * W_ for H_, W_ in value_spatial_shapes], dim=1)
    sampling_grids = 2 * sampling_locations - 1
    sampling_value_list = []
    for level, (H_, W_) in enumerate(value_spatial_shapes):
        value_l_ = value_list[level].flatten(2).transpose(1, 2).reshape(bs * num_heads, embed_dims, H_, W_)
        sampling_grid_l_ = sampling_grids[:, :, :, level].transpose(1, 2).flatten(0, 1)
        sampling_value_l_ = F.grid_sample(value_l_, sampling_grid_l_, mode="bilinear", padding_mode="zeros",
                                          align_corners=False)
        sampling_value_list.append(sampling_value_l_)
    attention_weights = attention_weights.transpose(1, 2).reshape(bs * num_heads, 1, num_queries,
                                                                  num_levels * num_points)
    output = ((torch.stack(sampling_value_list, dim=-2).flatten(-2) * attention_weights).sum(-1)
              .view(bs, num_heads * embed_dims, num_queries))
    return output.transpose(1, 2).contiguous()


def _msdeformattn_class():
    """A re-implementation of Ultralytics' `MSDeformAttn` (ultralytics/nn/modules/transformer.py):
    constructor, parameters and forward; `value_shapes` a list of (H, W)."""
    torch = _torch()
    nn, F = torch.nn, torch.nn.functional

    class MSDeformAttn(nn.Module):
        def __init__(self, d_model=256, n_levels=4, n_heads=8, n_points=4):
            super().__init__()
            self.im2col_step = 64
            self.d_model, self.n_levels, self.n_heads, self.n_points = d_model, n_levels, n_heads, n_points
            self.sampling_offsets = nn.Linear(d_model, n_heads * n_levels * n_points * 2)
            self.attention_weights = nn.Linear(d_model, n_heads * n_levels * n_points)
            self.value_proj = nn.Linear(d_model, d_model)
            self.output_proj = nn.Linear(d_model, d_model)
            nn.init.uniform_(self.sampling_offsets.bias, -2.0, 2.0)

        def forward(self, query, refer_bbox, value, value_shapes, value_mask=None):
            bs, len_q = query.shape[:2]
            len_v = value.shape[1]
            value = self.value_proj(value)
            if value_mask is not None:
                value = value.masked_fill(value_mask[..., None], float(0))
            value = value.view(bs, len_v, self.n_heads, self.d_model // self.n_heads)
            sampling_offsets = self.sampling_offsets(query).view(bs, len_q, self.n_heads, self.n_levels,
                                                                 self.n_points, 2)
            attention_weights = self.attention_weights(query).view(bs, len_q, self.n_heads,
                                                                   self.n_levels * self.n_points)
            attention_weights = F.softmax(attention_weights, -1).view(bs, len_q, self.n_heads, self.n_levels,
                                                                      self.n_points)
            num_points = refer_bbox.shape[-1]
            if num_points == 2:
                offset_normalizer = torch.as_tensor(value_shapes, dtype=query.dtype, device=query.device).flip(-1)
                add = sampling_offsets / offset_normalizer[None, None, None, :, None, :]
                sampling_locations = refer_bbox[:, :, None, :, None, :] + add
            else:
                add = sampling_offsets / self.n_points * refer_bbox[:, :, None, :, None, 2:] * 0.5
                sampling_locations = refer_bbox[:, :, None, :, None, :2] + add
            output = _ms_deform_attn_pytorch(value, value_shapes, sampling_locations, attention_weights)
            return self.output_proj(output)

    return MSDeformAttn


_LEVELS = [(12, 16), (6, 8), (3, 4), (2, 2)]


def ultralytics_rtdetr(batch=1, coords=4, levels=_LEVELS, queries=12) -> Built:
    """Two of Ultralytics' decoder layers' cross-attention (re-implementation, see above) on encoder
    memory, as its RT-DETR decoder calls them: `value_shapes` a list, references boxes (4) or
    points (2)."""
    torch = _torch()
    cls = _msdeformattn_class()

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(cls(d_model=32, n_levels=len(levels), n_heads=4, n_points=2)
                                              for _ in range(2))

        def forward(self, query, refer_bbox, memory):
            for layer in self.layers:
                query = query + layer(query, refer_bbox, memory, levels)
            return query

    s = sum(h * w for h, w in levels)
    ref = torch.rand(batch, queries, 1, coords) * 0.8 + 0.1
    ref = ref.expand(-1, -1, len(levels), -1).contiguous() if coords == 2 else ref
    model = Decoder().eval()
    return Built(model, (torch.randn(batch, queries, 32), ref, torch.randn(batch, s, 32)),
                 ["query", "refer_bbox", "memory"], {"query": {0: "batch"}, "refer_bbox": {0: "batch"},
                                                      "memory": {0: "batch"}}, 2)


def mmcv_fallback(batch=1, levels=_LEVELS, queries=12) -> Built:
    """A decoder layer's cross-attention in mmcv's style (batch_first=False: (L, N, C) in and out)
    around the re-implemented `multi_scale_deformable_attn_pytorch`, level sizes a tensor as mmcv
    passes them."""
    torch = _torch()
    nn = torch.nn

    class MultiScaleDeformableAttention(nn.Module):
        def __init__(self, embed_dims=32, num_heads=4, num_levels=4, num_points=2):
            super().__init__()
            self.embed_dims, self.num_heads, self.num_levels, self.num_points = embed_dims, num_heads, num_levels, \
                num_points
            self.sampling_offsets = nn.Linear(embed_dims, num_heads * num_levels * num_points * 2)
            self.attention_weights = nn.Linear(embed_dims, num_heads * num_levels * num_points)
            self.value_proj = nn.Linear(embed_dims, embed_dims)
            self.output_proj = nn.Linear(embed_dims, embed_dims)
            nn.init.uniform_(self.sampling_offsets.bias, -2.0, 2.0)

        def forward(self, query, value, reference_points, spatial_shapes):
            identity = query
            query = query.permute(1, 0, 2)
            value = value.permute(1, 0, 2)
            bs, num_query, _ = query.shape
            bs, num_value, _ = value.shape
            value = self.value_proj(value).view(bs, num_value, self.num_heads, -1)
            sampling_offsets = self.sampling_offsets(query).view(bs, num_query, self.num_heads, self.num_levels,
                                                                 self.num_points, 2)
            attention_weights = self.attention_weights(query).view(bs, num_query, self.num_heads,
                                                                   self.num_levels * self.num_points)
            attention_weights = attention_weights.softmax(-1).view(bs, num_query, self.num_heads, self.num_levels,
                                                                   self.num_points)
            offset_normalizer = torch.stack([spatial_shapes[..., 1], spatial_shapes[..., 0]], -1)
            sampling_locations = (reference_points[:, :, None, :, None, :]
                                  + sampling_offsets / offset_normalizer[None, None, None, :, None, :])
            output = _ms_deform_attn_pytorch(value, spatial_shapes, sampling_locations, attention_weights)
            output = self.output_proj(output).permute(1, 0, 2)
            return output + identity

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = MultiScaleDeformableAttention(num_levels=len(levels))
            self.register_buffer("spatial_shapes", torch.tensor(levels, dtype=torch.long), persistent=False)

        def forward(self, query, value, reference_points):
            return self.attn(query, value, reference_points, self.spatial_shapes)

    s = sum(h * w for h, w in levels)
    model = Layer().eval()
    inputs = (torch.randn(queries, batch, 32), torch.randn(s, batch, 32),
              torch.rand(batch, queries, len(levels), 2) * 1.2 - 0.1)
    return Built(model, inputs, ["query", "value", "reference_points"],
                 {"query": {1: "batch"}, "value": {1: "batch"}, "reference_points": {0: "batch"}}, 1)


FAMILIES: dict[str, Callable[..., Built]] = {
    "deformable_detr": deformable_detr,
    "rt_detr": rt_detr,
    "rt_detr_v2": rt_detr_v2,
    "d_fine": d_fine,
    "grounding_dino": grounding_dino,
    "mask2former": mask2former,
    "oneformer_pixel_decoder": oneformer_pixel_decoder,
    "mmcv_fallback": mmcv_fallback,
    "ultralytics_rtdetr": ultralytics_rtdetr,
}


@contextlib.contextmanager
def exporting(built: Built, *, dynamo: bool):
    """What exporting ``built`` needs around torch.onnx.export (or opbridge.onnx.export): no grad,
    warnings off, the model's export patches, and for the dynamo exporter transformers' torch._check
    calls turned off (they become aten._is_all_true, which it cannot export; transformers' own switch)."""
    env = mock.patch.dict(os.environ, {"TRANSFORMERS_DISABLE_TORCH_CHECK": "1"}) if dynamo else contextlib.nullcontext()
    with warnings.catch_warnings(), _torch().no_grad(), env, built.export_patch():
        warnings.simplefilter("ignore")
        yield


def export(built: Built, path: str, *, dynamo: bool, opset: int, dynamic: bool = False, dtype: str = "float32"):
    """The plain export of ``built`` (torch.onnx.export, no opbridge) to ``path``."""
    torch = _torch()
    model, inputs = built.model, built.inputs
    if dtype != "float32":
        cast = getattr(torch, dtype)
        model = copy.deepcopy(model).to(cast)  # the caller's model stays float32
        inputs = tuple(x.to(cast) if x.is_floating_point() else x for x in inputs)
    with exporting(built, dynamo=dynamo):
        if dynamo:
            kw = {}
            if dynamic:
                from torch.export import Dim

                dims: dict[str, Any] = {}
                kw["dynamic_shapes"] = tuple(
                    {a: dims.setdefault(n, Dim.AUTO) for a, n in built.dynamic.get(name, {}).items()} or None
                    for name in built.names)
            torch.onnx.export(model, inputs, path, dynamo=True, opset_version=opset, input_names=built.names,
                              external_data=False, **kw)
        else:
            kw = {"dynamic_axes": {n: built.dynamic[n] for n in built.names if n in built.dynamic}} if dynamic else {}
            torch.onnx.export(model, inputs, path, dynamo=False, opset_version=opset, input_names=built.names, **kw)
    return model, inputs
