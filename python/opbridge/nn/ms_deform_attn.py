"""Drop-in replacements for the multi-scale deformable attention modules of transformers, mmcv and
Deformable-DETR: the same projections and arithmetic as the original forward, with only the core
sampling step (the pure-PyTorch grid_sample chain or a library's own kernel) computed by
``opbridge.ops.ms_deform_attn``.

A replacement is built from the original module by sharing its ``__dict__`` (parameters,
buffers, submodules, hooks, attributes): state_dict keys and values stay the same, and no
library function is patched (conversion changes nothing outside the converted model).

Recognised (see docs/ms_deform_attn.md):
  * transformers' parameterless ``MultiScaleDeformableAttention`` core module (the class copy of
    deformable_detr, grounding_dino, mm_grounding_dino, lw_detr, omdet_turbo, rf_detr, rt_detr,
    pp_doclayout_v2/v3/v4): forward(value, value_spatial_shapes, value_spatial_shapes_list,
    level_start_index, sampling_locations, attention_weights, im2col_step);
  * transformers' Mask2Former / OneFormer pixel-decoder attention modules, which call the module
    function ``multi_scale_deformable_attention``;
  * mmcv's ``MultiScaleDeformableAttention`` (mmcv.ops) and Deformable-DETR's ``MSDeformAttn``,
    recognised by class name, attributes and forward signature.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .. import ops

__all__ = ["replacement_for", "looks_like_msda"]


def _params(m: torch.nn.Module) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(type(m).forward).parameters)[1:]
    except (TypeError, ValueError):  # pragma: no cover - builtin forward
        return ()


def _level_start_index(spatial_shapes: torch.Tensor) -> torch.Tensor:
    areas = spatial_shapes[:, 0] * spatial_shapes[:, 1]
    return torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]])


def _shared(cls: type, m: torch.nn.Module) -> torch.nn.Module:
    new = cls.__new__(cls)
    new.__dict__.update(m.__dict__)
    return new


def _sampling_locations(reference_points: torch.Tensor, sampling_offsets: torch.Tensor,
                        offset_normalizer: torch.Tensor, n_points: int) -> torch.Tensor:
    """The locations every recognised module computes (reference points plus normalised
    offsets; 4-coordinate references are boxes (cx, cy, w, h))."""
    if reference_points.shape[-1] == 2:
        return (reference_points[:, :, None, :, None, :]
                + sampling_offsets / offset_normalizer[None, None, None, :, None, :])
    if reference_points.shape[-1] == 4:
        return (reference_points[:, :, None, :, None, :2]
                + sampling_offsets / n_points * reference_points[:, :, None, :, None, 2:] * 0.5)
    raise ValueError(f"Last dim of reference_points must be 2 or 4, but got {reference_points.shape[-1]}")


# --- transformers: the parameterless core module (class-copy families) --------------------------

_HF_CORE_PARAMS = ("value", "value_spatial_shapes", "value_spatial_shapes_list", "level_start_index",
                   "sampling_locations", "attention_weights", "im2col_step")


class TransformersMultiScaleDeformableAttention(torch.nn.Module):
    """Replaces transformers' ``MultiScaleDeformableAttention`` (the module its
    ``*MultiscaleDeformableAttention`` layers hold as ``self.attn``); same call signature."""

    def forward(self, value: torch.Tensor, value_spatial_shapes: torch.Tensor, value_spatial_shapes_list: Any,
                level_start_index: torch.Tensor, sampling_locations: torch.Tensor, attention_weights: torch.Tensor,
                im2col_step: int = 64) -> torch.Tensor:
        # im2col_step is a CUDA-kernel batching knob of the original; it does not change the result.
        return ops.ms_deform_attn(value, value_spatial_shapes, level_start_index, sampling_locations,
                                  attention_weights)


def _is_hf_core(m: torch.nn.Module) -> bool:
    return (type(m).__name__ == "MultiScaleDeformableAttention" and _params(m)[:7] == _HF_CORE_PARAMS
            and not any(True for _ in m.parameters(recurse=False)))


# --- transformers: Mask2Former / OneFormer pixel-decoder attention (functional call) ------------

class TransformersPixelDecoderMultiscaleDeformableAttention(torch.nn.Module):
    """Replaces ``Mask2FormerPixelDecoderEncoderMultiscaleDeformableAttention`` and
    ``OneFormerPixelDecoderEncoderMultiscaleDeformableAttention``: their forward (transformers
    5.x), with ``multi_scale_deformable_attention(...)`` computed by opbridge. Both mask
    *padding* positions (attention_mask True = padding), unlike DeformableDetr's layer."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                encoder_hidden_states: torch.Tensor | None = None, encoder_attention_mask: Any = None,
                position_embeddings: torch.Tensor | None = None, reference_points: torch.Tensor | None = None,
                *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        # Mask2Former: (..., spatial_shapes_list, level_start_index, output_attentions);
        # OneFormer: (..., spatial_shapes, level_start_index, output_attentions, spatial_shapes_list).
        bound = self._signature.bind(hidden_states, attention_mask, encoder_hidden_states, encoder_attention_mask,
                                     position_embeddings, reference_points, *args, **kwargs).arguments
        spatial_shapes = bound.get("spatial_shapes")
        spatial_shapes_list = bound.get("spatial_shapes_list")
        if position_embeddings is not None:
            hidden_states = hidden_states + position_embeddings
        batch_size, num_queries, _ = hidden_states.shape
        batch_size, sequence_length, _ = encoder_hidden_states.shape
        if spatial_shapes is None:
            spatial_shapes = torch.tensor([[int(h), int(w)] for h, w in spatial_shapes_list], dtype=torch.long,
                                          device=hidden_states.device)
            torch._check(sum(int(h) * int(w) for h, w in spatial_shapes_list) == sequence_length,
                         lambda: "Make sure to align the spatial shapes with the sequence length of the encoder "
                                 "hidden states")
        value = self.value_proj(encoder_hidden_states)
        if attention_mask is not None:
            value = value.masked_fill(attention_mask[..., None], float(0))
        value = value.view(batch_size, sequence_length, self.n_heads, self.d_model // self.n_heads)
        sampling_offsets = self.sampling_offsets(hidden_states).view(
            batch_size, num_queries, self.n_heads, self.n_levels, self.n_points, 2)
        attention_weights = self.attention_weights(hidden_states).view(
            batch_size, num_queries, self.n_heads, self.n_levels * self.n_points)
        attention_weights = F.softmax(attention_weights, -1).view(
            batch_size, num_queries, self.n_heads, self.n_levels, self.n_points)
        offset_normalizer = torch.stack([spatial_shapes[..., 1], spatial_shapes[..., 0]], -1)
        sampling_locations = _sampling_locations(reference_points, sampling_offsets, offset_normalizer, self.n_points)
        output = ops.ms_deform_attn(value, spatial_shapes, _level_start_index(spatial_shapes), sampling_locations,
                                    attention_weights)
        return self.output_proj(output), attention_weights

    @classmethod
    def from_module(cls, m: torch.nn.Module) -> torch.nn.Module:
        # A per-source subclass keeps the original's forward signature for argument binding.
        sub = type(f"Opbridge{type(m).__name__}", (cls,), {"_signature": inspect.signature(type(m).forward)})
        sub.__module__ = __name__
        sub._signature = inspect.Signature(list(sub._signature.parameters.values())[1:])
        return _shared(sub, m)


_PIXEL_DECODER_CLASSES = ("Mask2FormerPixelDecoderEncoderMultiscaleDeformableAttention",
                          "OneFormerPixelDecoderEncoderMultiscaleDeformableAttention")
_PROJECTIONS = ("sampling_offsets", "attention_weights", "value_proj", "output_proj")


def _has(m: torch.nn.Module, names: tuple[str, ...]) -> bool:
    return all(hasattr(m, n) for n in names)


def _is_pixel_decoder(m: torch.nn.Module) -> bool:
    return (type(m).__name__ in _PIXEL_DECODER_CLASSES and _has(m, _PROJECTIONS + ("n_heads", "n_levels", "n_points",
                                                                                   "d_model"))
            and _params(m)[:6] == ("hidden_states", "attention_mask", "encoder_hidden_states",
                                   "encoder_attention_mask", "position_embeddings", "reference_points"))


# --- Deformable-DETR: MSDeformAttn (models/ops/modules/ms_deform_attn.py) -----------------------

class MSDeformAttn(torch.nn.Module):
    """Replaces Deformable-DETR's ``MSDeformAttn`` (d_model, n_levels, n_heads, n_points); its
    forward with ``MSDeformAttnFunction.apply`` computed by opbridge."""

    def forward(self, query: torch.Tensor, reference_points: torch.Tensor, input_flatten: torch.Tensor,
                input_spatial_shapes: torch.Tensor, input_level_start_index: torch.Tensor,
                input_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        N, Len_q, _ = query.shape
        N, Len_in, _ = input_flatten.shape
        value = self.value_proj(input_flatten)
        if input_padding_mask is not None:
            value = value.masked_fill(input_padding_mask[..., None], float(0))
        value = value.view(N, Len_in, self.n_heads, self.d_model // self.n_heads)
        sampling_offsets = self.sampling_offsets(query).view(N, Len_q, self.n_heads, self.n_levels, self.n_points, 2)
        attention_weights = self.attention_weights(query).view(N, Len_q, self.n_heads, self.n_levels * self.n_points)
        attention_weights = F.softmax(attention_weights, -1).view(N, Len_q, self.n_heads, self.n_levels,
                                                                  self.n_points)
        offset_normalizer = torch.stack([input_spatial_shapes[..., 1], input_spatial_shapes[..., 0]], -1)
        sampling_locations = _sampling_locations(reference_points, sampling_offsets, offset_normalizer, self.n_points)
        output = ops.ms_deform_attn(value, input_spatial_shapes, input_level_start_index, sampling_locations,
                                    attention_weights)
        return self.output_proj(output)


def _is_msdeformattn(m: torch.nn.Module) -> bool:
    return (type(m).__name__ == "MSDeformAttn" and _has(m, _PROJECTIONS + ("n_heads", "n_levels", "n_points",
                                                                           "d_model"))
            and _params(m)[:5] == ("query", "reference_points", "input_flatten", "input_spatial_shapes",
                                   "input_level_start_index"))


# --- mmcv: mmcv.ops.MultiScaleDeformableAttention ----------------------------------------------

class MmcvMultiScaleDeformableAttention(torch.nn.Module):
    """Replaces mmcv's ``MultiScaleDeformableAttention`` (embed_dims, num_heads, num_levels,
    num_points, im2col_step, dropout, batch_first, ..., value_proj_ratio); its forward with the
    CUDA function / ``multi_scale_deformable_attn_pytorch`` computed by opbridge."""

    def forward(self, query: torch.Tensor, key: torch.Tensor | None = None, value: torch.Tensor | None = None,
                identity: torch.Tensor | None = None, query_pos: torch.Tensor | None = None,
                key_padding_mask: torch.Tensor | None = None, reference_points: torch.Tensor | None = None,
                spatial_shapes: torch.Tensor | None = None, level_start_index: torch.Tensor | None = None,
                **kwargs: Any) -> torch.Tensor:
        if value is None:
            value = query
        if identity is None:
            identity = query
        if query_pos is not None:
            query = query + query_pos
        if not self.batch_first:
            # (num_query, bs, embed_dims) -> (bs, num_query, embed_dims)
            query = query.permute(1, 0, 2)
            value = value.permute(1, 0, 2)
        bs, num_query, _ = query.shape
        bs, num_value, _ = value.shape
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
        offset_normalizer = torch.stack([spatial_shapes[..., 1], spatial_shapes[..., 0]], -1)
        sampling_locations = _sampling_locations(reference_points, sampling_offsets, offset_normalizer,
                                                 self.num_points)
        output = ops.ms_deform_attn(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)
        output = self.output_proj(output)
        if not self.batch_first:
            output = output.permute(1, 0, 2)
        return self.dropout(output) + identity


def _is_mmcv(m: torch.nn.Module) -> bool:
    return (type(m).__name__ == "MultiScaleDeformableAttention"
            and _has(m, _PROJECTIONS + ("num_heads", "num_levels", "num_points", "batch_first", "dropout"))
            and _params(m)[:9] == ("query", "key", "value", "identity", "query_pos", "key_padding_mask",
                                   "reference_points", "spatial_shapes", "level_start_index"))


# --- dispatch -----------------------------------------------------------------------------------

_RECOGNISERS: tuple[tuple[Callable[[torch.nn.Module], bool], Callable[[torch.nn.Module], torch.nn.Module]], ...] = (
    (_is_hf_core, lambda m: _shared(TransformersMultiScaleDeformableAttention, m)),
    (_is_pixel_decoder, TransformersPixelDecoderMultiscaleDeformableAttention.from_module),
    (_is_msdeformattn, lambda m: _shared(MSDeformAttn, m)),
    (_is_mmcv, lambda m: _shared(MmcvMultiScaleDeformableAttention, m)),
)
_REPLACED = (TransformersMultiScaleDeformableAttention, TransformersPixelDecoderMultiscaleDeformableAttention,
             MSDeformAttn, MmcvMultiScaleDeformableAttention)
# transformers' multi_scale_deformable_attention_v2 layers (RT-DETRv2, D-FINE, DEIMv2; per-level point counts).
from . import ms_deform_attn_v2 as _v2  # noqa: E402  (it does not import this module: no cycle)
_RECOGNISERS += _v2.RECOGNISERS
_REPLACED += _v2.REPLACED

# Class names that suggest a deformable-attention module (for the warning about unknown variants).
_MSDA_NAME = re.compile(r"deform(able)?_?(attn|attention)", re.IGNORECASE)


def replacement_for(m: torch.nn.Module) -> torch.nn.Module | None:
    """The opbridge replacement of a recognised MSDA module (sharing its state), else None."""
    if isinstance(m, _REPLACED):
        return None
    for recognise, make in _RECOGNISERS:
        if recognise(m):
            return make(m)
    return None


def looks_like_msda(m: torch.nn.Module) -> bool:
    """True for a module whose class name says deformable attention (recognised or not)."""
    return bool(_MSDA_NAME.search(type(m).__name__)) and not isinstance(m, _REPLACED)
