"""Drop-in replacements for transformers' deformable-attention layers that call
``multi_scale_deformable_attention_v2`` (per-level point counts): RT-DETRv2, D-FINE and DEIMv2.

The v2 function with ``method="default"`` is bilinear ``grid_sample`` of ``2·loc − 1`` with zero
padding and ``align_corners=False`` (the semantics of ``opbridge.ops.ms_deform_attn``), but level l
has its own number of points P_l: locations (N, Lq, M, ΣP_l, 2), weights (N, Lq, M, ΣP_l). The op
takes one point count for all levels, so every level is padded to P = max(P_l) with points of
attention weight 0 placed off every map (see ``ms_deform_attn_per_level``). ``method="discrete"``
(nearest-pixel gather) is different arithmetic: such modules are not recognised and stay as they
are (named in convert's warning).

A replacement shares the original's ``__dict__`` (parameters, buffers, hooks, attributes) and runs
the original forward with only the call of the v2 function swapped; see docs/ms_deform_attn.md.
"""

from __future__ import annotations

import inspect
import sys
from types import ModuleType
from typing import Any, Callable, Sequence, cast

import torch
import torch.nn.functional as F

from .. import ops
from .ms_deform_attn import _DeformableLayer, _level_start_index, _op_tables, _params
from .ms_deform_attn import _shared as _share_state

__all__ = ["ms_deform_attn_per_level", "RECOGNISERS", "REPLACED"]

# Padded points sample at this (x, y): pixel coordinate (-W - 0.5, -H - 0.5), where no bilinear
# tap of any level lies on the map. Such a sample contributes exactly 0 without reading value
# (its weight is 0 too), so even a non-finite value somewhere cannot turn it into 0 * inf = NaN;
# and it is finite, so no NaN * 0 arises in the gradients either.
_PAD_LOCATION = -1.0


def _pad_index(num_points_list: Sequence[int], device: torch.device) -> torch.Tensor:
    """Index into the points axis extended by one pad point (at position ΣP_l) that lays level l's
    P_l points out as P = max(P_l) slots: level l's points, then the pad point P - P_l times."""
    p, total, start, idx = max(num_points_list), sum(num_points_list), 0, []
    for n in num_points_list:
        idx += list(range(start, start + n)) + [total] * (p - n)
        start += n
    return torch.tensor(idx, dtype=torch.long, device=device)


def ms_deform_attn_per_level(value: torch.Tensor, spatial_shapes: torch.Tensor, sampling_locations: torch.Tensor,
                      attention_weights: torch.Tensor, num_points_list: Sequence[int],
                      spatial_shapes_list: Any = None) -> torch.Tensor:
    """transformers' ``multi_scale_deformable_attention_v2(..., method="default")`` through
    ``opbridge.ops.ms_deform_attn``: value (N, S, M, D); spatial_shapes (L, 2) int64 rows (H, W);
    sampling_locations (N, Lq, M, ΣP_l, 2), level by level; attention_weights (N, Lq, M, ΣP_l);
    num_points_list the L point counts P_l; spatial_shapes_list the same level sizes as ints, where
    the caller has them (the op then reads host-memory tables built from them: no device copy).
    Returns (N, Lq, M·D).

    Levels with fewer than max(P_l) points are padded with points of weight 0 whose every tap lies
    off the map: they add exactly 0 (and nothing to any gradient), so the result is the v2
    function's up to the order of the float sums."""
    # Unpacked as the v2 function does: the same ValueError for locations of another rank.
    batch, num_queries, heads, _, _ = sampling_locations.shape
    num_points_list = [int(n) for n in num_points_list]
    if len(num_points_list) != spatial_shapes.shape[0] or sum(num_points_list) != sampling_locations.shape[3]:
        raise ValueError(f"ms_deform_attn_per_level: num_points_list {num_points_list} must have one count per level "
                         f"({spatial_shapes.shape[0]}) adding up to sampling_locations.shape[3] "
                         f"({sampling_locations.shape[3]})")
    levels, points = len(num_points_list), max(num_points_list, default=0)
    if spatial_shapes.dtype != torch.int64:
        spatial_shapes = spatial_shapes.to(torch.int64)
    if len(set(num_points_list)) <= 1:
        # Equal counts (RT-DETRv2 always, D-FINE / DEIMv2 often): a view, no padding.
        locations = sampling_locations.reshape(batch, num_queries, heads, levels, points, 2)
        weights = attention_weights.reshape(batch, num_queries, heads, levels, points)
    else:
        # One pad point appended to the points axis, then one gather lays the points out level by
        # level (two small copies of locations and weights; value is not touched).
        index = _pad_index(num_points_list, sampling_locations.device)
        locations = F.pad(sampling_locations, (0, 0, 0, 1), value=_PAD_LOCATION)
        weights = F.pad(attention_weights, (0, 1), value=0.0)
        locations = locations.index_select(3, index).view(batch, num_queries, heads, levels, points, 2)
        weights = weights.index_select(3, index).view(batch, num_queries, heads, levels, points)
    tables = _op_tables(spatial_shapes, _level_start_index(spatial_shapes), spatial_shapes_list)
    return ops.ms_deform_attn(value, *tables, locations, weights)


# --- helpers ------------------------------------------------------------------------------------

def _source(m: torch.nn.Module) -> ModuleType | None:
    return sys.modules.get(type(m).__module__)


def _library_v2(source: ModuleType | None) -> Callable[..., torch.Tensor] | None:
    """The source module's own ``multi_scale_deformable_attention_v2`` (not one put there by
    someone else: then the module computes something unknown and is left alone)."""
    fn = getattr(source, "multi_scale_deformable_attention_v2", None)
    if (inspect.isfunction(fn) and fn.__module__ == getattr(source, "__name__", None)
            and tuple(inspect.signature(fn).parameters) == ("value", "value_spatial_shapes", "sampling_locations",
                                                            "attention_weights", "num_points_list", "method")):
        return fn
    return None


def _points_list(m: torch.nn.Module, name: str) -> bool:
    pts = getattr(m, name, None)
    return (isinstance(pts, list) and len(pts) == getattr(m, "n_levels", None)
            and all(isinstance(n, int) and n > 0 for n in pts))


def _shared(cls: type, m: torch.nn.Module) -> torch.nn.Module:
    """A ``cls`` instance with a copy of m's ``__dict__`` (the same parameters, buffers, submodules
    and hooks), plus what the forward needs from the module m's class is defined in: its name,
    its check function and its v2 function (plain references: the replacement pickles)."""
    source = cast(ModuleType, _source(m))
    new = _share_state(cls, m)
    new.__dict__.update(_opbridge_source=source.__name__, _opbridge_check=source.torch_compilable_check,
                        _opbridge_v2=_library_v2(source))
    return new


class _V2Base(torch.nn.Module):
    # Set by _shared (from the module the original class is defined in).
    _opbridge_source: str
    _opbridge_check: Callable[[Any, str], None]
    _opbridge_v2: Callable[..., torch.Tensor] | None

    def _check(self, cond: Any, msg: str) -> None:
        # Eagerly (and under torch.compile) the source's own torch_compilable_check: failing inputs
        # fail exactly as in the unconverted layer. Under export and tracing it is skipped: it records a tensor
        # assertion (aten._is_all_true) that the ONNX exporter cannot translate (the unconverted
        # layer does not export with the dynamo exporter for that reason), and the op checks the
        # same (sum of H * W == S) itself at run time, in torch and in ORT.
        if torch.compiler.is_exporting() or torch.jit.is_tracing():  # type: ignore[attr-defined,no-untyped-call]
            return
        self._opbridge_check(cond, msg)


# --- RT-DETRv2 ---------------------------------------------------------------------------------

class RTDetrV2MultiscaleDeformableAttention(_V2Base, _DeformableLayer):
    """Replaces transformers' ``RTDetrV2MultiscaleDeformableAttention`` (5.x): its forward, with the
    module-level ``multi_scale_deformable_attention_v2(..., self.method)`` computed by
    ``ms_deform_attn_per_level`` while ``self.method == "default"`` (otherwise the library function runs,
    unchanged). Returns (output, attention_weights) as the original."""

    # The original's further attributes (shared __dict__).
    n_points_scale: torch.Tensor
    n_points_list: list[int]
    offset_scale: float
    method: str

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                encoder_hidden_states: Any = None, encoder_attention_mask: Any = None,
                position_embeddings: torch.Tensor | None = None, reference_points: Any = None,
                spatial_shapes: Any = None, spatial_shapes_list: Any = None, level_start_index: Any = None,
                **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if position_embeddings is not None:
            hidden_states = hidden_states + position_embeddings
        batch_size, num_queries, _ = hidden_states.shape
        batch_size, sequence_length, _ = encoder_hidden_states.shape
        self._check((spatial_shapes[:, 0] * spatial_shapes[:, 1]).sum() == sequence_length,
                    "Make sure to align the spatial shapes with the sequence length of the encoder hidden states")
        value = self.value_proj(encoder_hidden_states)
        if attention_mask is not None:
            value = value.masked_fill(~attention_mask[..., None], float(0))
        value = value.view(batch_size, sequence_length, self.n_heads, self.d_model // self.n_heads)
        sampling_offsets = self.sampling_offsets(hidden_states).view(
            batch_size, num_queries, self.n_heads, self.n_levels * self.n_points, 2)
        attention_weights = self.attention_weights(hidden_states).view(
            batch_size, num_queries, self.n_heads, self.n_levels * self.n_points)
        attention_weights = F.softmax(attention_weights, -1)
        if reference_points.shape[-1] == 2:
            offset_normalizer = torch.stack([spatial_shapes[..., 1], spatial_shapes[..., 0]], -1)
            sampling_locations = (reference_points[:, :, None, :, None, :]
                                  + sampling_offsets / offset_normalizer[None, None, None, :, None, :])
        elif reference_points.shape[-1] == 4:
            n_points_scale = self.n_points_scale.to(dtype=hidden_states.dtype).unsqueeze(-1)
            offset = sampling_offsets * n_points_scale * reference_points[:, :, None, :, 2:] * self.offset_scale
            sampling_locations = reference_points[:, :, None, :, :2] + offset
        else:
            raise ValueError(f"Last dim of reference_points must be 2 or 4, but got {reference_points.shape[-1]}")
        if self.method == "default":
            output = ms_deform_attn_per_level(value, spatial_shapes, sampling_locations, attention_weights,
                                       self.n_points_list, spatial_shapes_list)
        else:
            # As the original: the module-level function, looked up now.
            output = sys.modules[self._opbridge_source].multi_scale_deformable_attention_v2(
                value, spatial_shapes_list, sampling_locations, attention_weights, self.n_points_list, self.method)
        output = self.output_proj(output)
        return output, attention_weights


_RTDETR_V2_PARAMS = ("hidden_states", "attention_mask", "encoder_hidden_states", "encoder_attention_mask",
                     "position_embeddings", "reference_points", "spatial_shapes", "spatial_shapes_list",
                     "level_start_index")


def _is_rt_detr_v2(m: torch.nn.Module) -> bool:
    source = _source(m)
    return (type(m).__name__ == "RTDetrV2MultiscaleDeformableAttention"
            and _params(m)[:9] == _RTDETR_V2_PARAMS
            and all(hasattr(m, n) for n in ("sampling_offsets", "attention_weights", "value_proj", "output_proj",
                                            "n_heads", "n_levels", "n_points", "d_model", "offset_scale",
                                            "n_points_scale"))
            and getattr(m, "method", None) == "default" and _points_list(m, "n_points_list")
            and _library_v2(source) is not None and callable(getattr(source, "torch_compilable_check", None)))


# --- D-FINE and DEIMv2 (identical code in transformers 5.23) ----------------------------------

class DFineMultiscaleDeformableAttention(_V2Base):
    """Replaces transformers' ``DFineMultiscaleDeformableAttention`` and
    ``Deimv2MultiscaleDeformableAttention`` (5.x): their forward, with
    ``self.ms_deformable_attn_core(..., self.decoder_method)`` computed by ``ms_deform_attn_per_level``
    while that is the library's ``multi_scale_deformable_attention_v2`` and the method is
    "default" (otherwise the attribute runs, unchanged). Returns (output, attention_weights)."""

    # The original's attributes (shared __dict__).
    sampling_offsets: torch.nn.Module
    attention_weights: torch.nn.Module
    n_heads: int
    d_model: int
    n_levels: int
    num_points_scale: torch.Tensor
    num_points_list: list[int]
    offset_scale: float
    decoder_method: str
    ms_deformable_attn_core: Callable[..., torch.Tensor]

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                reference_points: Any = None, encoder_hidden_states: Any = None, spatial_shapes: Any = None,
                spatial_shapes_list: Any = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        batch_size, num_queries, _ = hidden_states.shape
        batch_size, sequence_length, _ = encoder_hidden_states.shape
        self._check((spatial_shapes[:, 0] * spatial_shapes[:, 1]).sum() == sequence_length,
                    "Make sure to align the spatial shapes with the sequence length of the encoder hidden states")
        value = encoder_hidden_states.reshape(batch_size, sequence_length, self.n_heads, self.d_model // self.n_heads)
        if attention_mask is not None:
            value = value.masked_fill(~attention_mask[..., None], float(0))
        sampling_offsets = self.sampling_offsets(hidden_states)
        sampling_offsets = sampling_offsets.reshape(batch_size, num_queries, self.n_heads,
                                                    sum(self.num_points_list), 2)
        attention_weights = self.attention_weights(hidden_states).reshape(
            batch_size, num_queries, self.n_heads, sum(self.num_points_list))
        attention_weights = F.softmax(attention_weights, dim=-1)
        if reference_points.shape[-1] == 2:
            offset_normalizer = torch.tensor(spatial_shapes)
            offset_normalizer = offset_normalizer.flip([1]).reshape(1, 1, 1, self.n_levels, 1, 2)
            sampling_locations = (reference_points.reshape(batch_size, sequence_length, 1, self.n_levels, 1, 2)
                                  + sampling_offsets / offset_normalizer)
        elif reference_points.shape[-1] == 4:
            num_points_scale = self.num_points_scale.to(dtype=hidden_states.dtype).unsqueeze(-1)
            offset = sampling_offsets * num_points_scale * reference_points[:, :, None, :, 2:] * self.offset_scale
            sampling_locations = reference_points[:, :, None, :, :2] + offset
        else:
            raise ValueError(
                f"Last dim of reference_points must be 2 or 4, but get {reference_points.shape[-1]} instead.")
        core = self.ms_deformable_attn_core
        if self.decoder_method == "default" and core is self._opbridge_v2:
            output = ms_deform_attn_per_level(value, spatial_shapes, sampling_locations, attention_weights,
                                       self.num_points_list, spatial_shapes_list)
        else:
            output = core(value, spatial_shapes_list, sampling_locations, attention_weights, self.num_points_list,
                          self.decoder_method)
        return output, attention_weights


_DFINE_CLASSES = ("DFineMultiscaleDeformableAttention", "Deimv2MultiscaleDeformableAttention")
_DFINE_PARAMS = ("hidden_states", "attention_mask", "reference_points", "encoder_hidden_states", "spatial_shapes",
                 "spatial_shapes_list")


def _is_d_fine(m: torch.nn.Module) -> bool:
    source = _source(m)
    core = _library_v2(source)
    return (type(m).__name__ in _DFINE_CLASSES and _params(m)[:6] == _DFINE_PARAMS
            and all(hasattr(m, n) for n in ("sampling_offsets", "attention_weights", "n_heads", "n_levels",
                                            "d_model", "offset_scale", "num_points_scale"))
            and getattr(m, "decoder_method", None) == "default" and _points_list(m, "num_points_list")
            and core is not None and m.__dict__.get("ms_deformable_attn_core") is core
            and callable(getattr(source, "torch_compilable_check", None)))


# For ms_deform_attn.py's dispatch: (recogniser, maker) pairs and the replacement classes.
RECOGNISERS: tuple[tuple[Callable[[torch.nn.Module], bool], Callable[[torch.nn.Module], torch.nn.Module]], ...] = (
    (_is_rt_detr_v2, lambda m: _shared(RTDetrV2MultiscaleDeformableAttention, m)),
    (_is_d_fine, lambda m: _shared(DFineMultiscaleDeformableAttention, m)),
)
REPLACED = (RTDetrV2MultiscaleDeformableAttention, DFineMultiscaleDeformableAttention)
