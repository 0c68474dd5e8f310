"""Drop-in replacements for the multi-scale deformable attention modules of transformers, mmcv and
Deformable-DETR: the same projections and arithmetic as the original forward, with only the core
sampling step (the pure-PyTorch grid_sample chain or a library's own kernel) computed by
``opbridge.ops.ms_deform_attn``.

A replacement is built from the original module by sharing its ``__dict__`` (parameters,
buffers, submodules, hooks, attributes): state_dict keys and values stay the same, and no
library function is patched (conversion changes nothing outside the converted model).

Recognised (see docs/ms_deform_attn.md):
  * transformers' ``*MultiscaleDeformableAttention`` layers whose forward is DeformableDetr's
    (deformable_detr, grounding_dino, mm_grounding_dino, lw_detr, omdet_turbo, rf_detr, rt_detr,
    pp_doclayout_v2/v3/v4): the whole layer, so that the sampling locations are computed in a
    fast layout too (see ``_sampling_locations``);
  * otherwise, transformers' parameterless ``MultiScaleDeformableAttention`` core module (the class copy of
    deformable_detr, grounding_dino, mm_grounding_dino, lw_detr, omdet_turbo, rf_detr, rt_detr,
    pp_doclayout_v2/v3/v4): forward(value, value_spatial_shapes, value_spatial_shapes_list,
    level_start_index, sampling_locations, attention_weights, im2col_step);
  * transformers' Mask2Former / OneFormer pixel-decoder attention modules, which call the module
    function ``multi_scale_deformable_attention``;
  * mmcv's ``MultiScaleDeformableAttention`` (mmcv.ops) and Deformable-DETR's ``MSDeformAttn``,
    recognised by class name, attributes and forward signature.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, cast

import torch
import torch.nn.functional as F

from .. import ops

__all__ = ["RECOGNISERS", "REPLACED"]


class _DeformableLayer(torch.nn.Module):
    """The attributes the DeformableDetr-form layers (transformers' layers, Deformable-DETR's
    MSDeformAttn, RT-DETRv2's) hold; a replacement reads them through the shared ``__dict__``."""

    # The originals' attributes, read through the shared __dict__.
    value_proj: torch.nn.Module
    sampling_offsets: torch.nn.Module
    attention_weights: torch.nn.Module
    output_proj: torch.nn.Module
    n_heads: int
    d_model: int
    n_levels: int
    n_points: int


def _params(m: torch.nn.Module) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(type(m).forward).parameters)[1:]
    except (TypeError, ValueError):  # pragma: no cover - builtin forward
        return ()


def _level_start_index(spatial_shapes: torch.Tensor) -> torch.Tensor:
    areas = spatial_shapes[:, 0] * spatial_shapes[:, 1]
    return torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]])


def _build_host_tables(levels: tuple[tuple[int, int], ...]) -> tuple[torch.Tensor, torch.Tensor]:
    shapes = torch.tensor(levels, dtype=torch.long).reshape(-1, 2)
    return shapes, _level_start_index(shapes)


_cached_host_tables = functools.lru_cache(maxsize=64)(_build_host_tables)


def _op_tables(spatial_shapes: torch.Tensor, level_start_index: torch.Tensor,
               spatial_shapes_list: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The level tables to hand the op. transformers passes spatial_shapes as a tensor on the
    model's device and the same sizes as Python ints (spatial_shapes_list, what its own
    pure-PyTorch path samples with); the op needs the tables on the host, so a CUDA tensor costs a
    device-to-host copy per call, which synchronizes and cannot be captured in a CUDA graph.
    Where the ints are there, the tables are built from them in host memory (cached per level
    layout; never written) and nothing is copied. Exports and traces keep the model's tensors, so
    the graph reads the sizes from its inputs, as the original layer's does."""
    if spatial_shapes_list is None or not _eager():
        return spatial_shapes, level_start_index
    try:
        levels = tuple((int(h), int(w)) for h, w in spatial_shapes_list)
    except (TypeError, ValueError):
        return spatial_shapes, level_start_index
    if torch.compiler.is_compiling():
        return _build_host_tables(levels)  # a constant of the compiled graph
    return _cached_host_tables(levels)


def _shared(cls: type[torch.nn.Module], m: torch.nn.Module) -> torch.nn.Module:
    new = cls.__new__(cls)
    new.__dict__.update(m.__dict__)
    return new


def _eager() -> bool:
    """False while an exporter traces the model (TorchScript tracer, torch.onnx.export)."""
    return not (torch.jit.is_tracing() or torch.onnx.is_in_onnx_export())  # type: ignore[attr-defined,no-untyped-call]


def _sampling_locations(reference_points: torch.Tensor, sampling_offsets: torch.Tensor,
                        offset_normalizer: torch.Tensor, n_points: int) -> torch.Tensor:
    """The locations every recognised module computes: reference points plus normalised offsets,
    ``reference_points[:, :, None, :, None, :] + sampling_offsets / offset_normalizer[None, None,
    None, :, None, :]``, or for 4-coordinate references (boxes cx, cy, w, h)
    ``reference_points[:, :, None, :, None, :2] + sampling_offsets / n_points *
    reference_points[:, :, None, :, None, 2:] * 0.5``.

    Written that way, torch broadcasts (N, Lq, 1, L, 1, 2) against (N, Lq, M, L, P, 2): inner
    dimensions of 2 and 1 make its elementwise loops ~10x slower than a copy (11.7 ms per
    Deformable-DETR encoder layer, more than the sampling itself). Here the per-level pairs are
    first repeated over the points (a small (N, Lq, 1, L*P*2) tensor) and the offsets viewed as
    (N, Lq, M, L*P*2), so the only broadcast is over the heads, with 32 contiguous elements inside
    (~1.2 ms). The same operations in the same order on the same values: bit-identical results."""
    coords = reference_points.shape[-1]
    if coords not in (2, 4):
        raise ValueError(f"Last dim of reference_points must be 2 or 4, but got {coords}")
    if reference_points.dim() != 4 or sampling_offsets.dim() != 6:
        return _sampling_locations_broadcast(reference_points, sampling_offsets, offset_normalizer, n_points)
    levels, points = sampling_offsets.shape[3], sampling_offsets.shape[4]

    def per_point(t: torch.Tensor) -> torch.Tensor:
        # (N, Lq, L or 1, 2) -> (N, Lq, 1, L*P*2): each level's pair repeated for its points.
        return t[:, :, None, :, None, :].expand(-1, -1, -1, levels, points, -1).flatten(3)

    offsets = sampling_offsets.flatten(3)  # a view of the projection's output
    if coords == 2:
        # offsets / normalizer divides in the promoted type; converting the (int64) sizes first is
        # the same conversion the promotion makes.
        dtype = torch.result_type(sampling_offsets, offset_normalizer)
        normalizer = offset_normalizer.to(dtype)[:, None, :].expand(levels, points, -1).flatten()
        reference = per_point(reference_points)
        if reference.dtype == dtype == offsets.dtype and _eager():
            # One pass instead of two; addcdiv computes input + 1 * (t1 / t2) (no fused
            # multiply-add is possible around the division), so the result is unchanged. Exports
            # write the plain form: the TorchScript exporter has no addcdiv, and the dynamo
            # exporter's Add(Mul(Div, 1)) would only cost ONNX Runtime a pass.
            locations = torch.addcdiv(reference, offsets, normalizer)
        else:
            locations = reference + offsets.to(dtype) / normalizer
    else:
        # Not addcmul: its multiply-add may be fused (one rounding), which would change results.
        locations = (per_point(reference_points[..., :2])
                     + offsets / n_points * per_point(reference_points[..., 2:]) * 0.5)
    return locations.view(locations.shape[:3] + (levels, points, 2))


def _sampling_locations_broadcast(reference_points: torch.Tensor, sampling_offsets: torch.Tensor,
                                  offset_normalizer: torch.Tensor, n_points: int) -> torch.Tensor:
    # The originals' own expression, for shapes the flat layout does not cover.
    if reference_points.shape[-1] == 2:
        return (reference_points[:, :, None, :, None, :]
                + sampling_offsets / offset_normalizer[None, None, None, :, None, :])
    return (reference_points[:, :, None, :, None, :2]
            + sampling_offsets / n_points * reference_points[:, :, None, :, None, 2:] * 0.5)


def _sample(query: torch.Tensor, value: torch.Tensor, reference_points: torch.Tensor, spatial_shapes: torch.Tensor,
            level_start_index: torch.Tensor, spatial_shapes_list: Any, sampling_offsets: torch.nn.Module,
            attention_weights: torch.nn.Module, n_heads: int, head_dim: int, n_levels: int,
            n_points: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The steps every replaced layer takes between projecting (and masking) the values and the
    output projection: per-head values, offsets, softmaxed weights, locations, the sampling (by
    opbridge). Returns (sampled, attention_weights)."""
    batch_size, num_queries, _ = query.shape
    sequence_length = value.shape[1]
    value = value.view(batch_size, sequence_length, n_heads, head_dim)
    offsets = sampling_offsets(query).view(batch_size, num_queries, n_heads, n_levels, n_points, 2)
    weights = attention_weights(query).view(batch_size, num_queries, n_heads, n_levels * n_points)
    weights = F.softmax(weights, -1).view(batch_size, num_queries, n_heads, n_levels, n_points)
    offset_normalizer = torch.stack([spatial_shapes[..., 1], spatial_shapes[..., 0]], -1)
    sampling_locations = _sampling_locations(reference_points, offsets, offset_normalizer, n_points)
    tables = _op_tables(spatial_shapes, level_start_index, spatial_shapes_list)
    return ops.ms_deform_attn(value, *tables, sampling_locations, weights), weights


def _attend(m: _DeformableLayer, hidden_states: torch.Tensor, value: torch.Tensor, reference_points: torch.Tensor,
            spatial_shapes: torch.Tensor, level_start_index: torch.Tensor,
            spatial_shapes_list: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``_sample`` with a DeformableDetr-form layer's attributes, then its output projection.
    Returns (output, attention_weights) as the transformers layers do."""
    output, attention_weights = _sample(hidden_states, value, reference_points, spatial_shapes, level_start_index,
                                        spatial_shapes_list, m.sampling_offsets, m.attention_weights, m.n_heads,
                                        m.d_model // m.n_heads, m.n_levels, m.n_points)
    return m.output_proj(output), attention_weights


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
        tables = _op_tables(value_spatial_shapes, level_start_index, value_spatial_shapes_list)
        return ops.ms_deform_attn(value, *tables, sampling_locations, attention_weights)


def _is_hf_core(m: torch.nn.Module) -> bool:
    return (type(m).__name__ == "MultiScaleDeformableAttention" and _params(m)[:7] == _HF_CORE_PARAMS
            and not any(True for _ in m.parameters(recurse=False)))


# --- transformers: the DeformableDetr-form layer that holds the core module as `self.attn` --------

class TransformersDeformableAttentionLayer(_DeformableLayer):
    """Replaces the ``*MultiscaleDeformableAttention`` layers whose forward is DeformableDetr's
    (transformers 5.x: deformable_detr, grounding_dino, mm_grounding_dino, lw_detr, omdet_turbo,
    rf_detr, rt_detr, pp_doclayout_v2/v3/v4): that forward, with the sampling locations computed in
    the flat layout of ``_sampling_locations`` and ``self.attn(...)`` computed by opbridge. Returns
    (output, attention_weights) as the original does.

    Each replaced class gets its own subclass of this class and of the original (``_subclass``):
    transformers records attention outputs (``output_attentions``) by isinstance checks against
    the original class, which must keep holding."""

    _original: type  # set on each per-class subclass
    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                encoder_hidden_states: torch.Tensor | None = None, encoder_attention_mask: Any = None,
                position_embeddings: torch.Tensor | None = None, reference_points: torch.Tensor | None = None,
                spatial_shapes: torch.Tensor | None = None, spatial_shapes_list: Any = None,
                level_start_index: torch.Tensor | None = None, *args: Any,
                **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        # The originals take `**kwargs` (transformers' output flags) or `output_attentions`, and use
        # neither; encoder_attention_mask is unused there too.
        if position_embeddings is not None:
            hidden_states = hidden_states + position_embeddings
        sequence_length = cast(torch.Tensor, encoder_hidden_states).shape[1]
        if spatial_shapes_list is not None and not torch.jit.is_tracing():  # type: ignore[attr-defined,no-untyped-call]
            # The original's check (the op checks it as well, from spatial_shapes; the TorchScript
            # tracer has the sizes as tensors here).
            torch._check_with(ValueError, sum(h * w for h, w in spatial_shapes_list) == sequence_length,
                              lambda: "Make sure to align the spatial shapes with the sequence length of the "
                                      "encoder hidden states")
        if spatial_shapes is None:
            spatial_shapes = torch.tensor([[int(h), int(w)] for h, w in spatial_shapes_list], dtype=torch.long,
                                          device=hidden_states.device)
        if level_start_index is None:
            level_start_index = _level_start_index(spatial_shapes)
        value = self.value_proj(encoder_hidden_states)
        if attention_mask is not None:
            # attention_mask is True where the input is valid (inverted, as the original does).
            # In place where value is known to be the projection's own new tensor (an unobserved
            # nn.Linear's output; autograd does not need it): saves copying the (N, S, d_model)
            # values in every layer. Exports keep the original's form.
            if type(self.value_proj) is torch.nn.Linear and not _has_hooks(self.value_proj) and _eager():
                value = value.masked_fill_(~attention_mask[..., None], float(0))
            else:
                value = value.masked_fill(~attention_mask[..., None], float(0))
        return _attend(self, hidden_states, value, cast(torch.Tensor, reference_points), spatial_shapes,
                       level_start_index, spatial_shapes_list)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # The per-class subclass is made at run time and cannot be found by name: pickle and
        # deepcopy rebuild it from the original class instead.
        return _new_outer, (self._original,), self.__getstate__()  # type: ignore[no-untyped-call]


_OUTER_SUBCLASSES: dict[type, type[torch.nn.Module]] = {}


def _subclass(original: type) -> type[torch.nn.Module]:
    sub = _OUTER_SUBCLASSES.get(original)
    if sub is None:
        sub = cast("type[torch.nn.Module]",
                   type(f"Opbridge{original.__name__}", (TransformersDeformableAttentionLayer, original),
                        {"_original": original, "__module__": __name__}))
        _OUTER_SUBCLASSES[original] = sub
    return sub


def _new_outer(original: type) -> torch.nn.Module:
    cls = _subclass(original)
    return cls.__new__(cls)


_OUTER_PARAMS = ("hidden_states", "attention_mask", "encoder_hidden_states", "encoder_attention_mask",
                 "position_embeddings", "reference_points", "spatial_shapes", "spatial_shapes_list",
                 "level_start_index")
# Lines of DeformableDetr's forward (whitespace removed) that the replacement's arithmetic relies on.
# Families whose layer differs in any of them (Mask2Former does not invert the mask, rt_detr_v2
# scales offsets per point, ...) keep their layer and get only the core module replaced.
_OUTER_SOURCE_LINES = (
    "hidden_states=hidden_states+position_embeddings",
    "value=self.value_proj(encoder_hidden_states)",
    "value=value.masked_fill(~attention_mask[...,None],float(0))",
    "value=value.view(batch_size,sequence_length,self.n_heads,self.d_model//self.n_heads)",
    "sampling_offsets=self.sampling_offsets(hidden_states).view(batch_size,num_queries,self.n_heads,self.n_levels,"
    "self.n_points,2)",
    "attention_weights=self.attention_weights(hidden_states).view(batch_size,num_queries,self.n_heads,"
    "self.n_levels*self.n_points)",
    "attention_weights=F.softmax(attention_weights,-1).view(batch_size,num_queries,self.n_heads,self.n_levels,"
    "self.n_points)",
    "offset_normalizer=torch.stack([spatial_shapes[...,1],spatial_shapes[...,0]],-1)",
    "reference_points[:,:,None,:,None,:]+sampling_offsets/offset_normalizer[None,None,None,:,None,:]",
    "reference_points[:,:,None,:,None,:2]+sampling_offsets/self.n_points*reference_points[:,:,None,:,None,2:]*0.5",
    "output=self.attn(value,spatial_shapes,spatial_shapes_list,level_start_index,sampling_locations,"
    "attention_weights,self.im2col_step,)",
    "output=self.output_proj(output)",
    "returnoutput,attention_weights",
)


def _has_hooks(m: torch.nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks)


def _is_hf_outer(m: torch.nn.Module) -> bool:
    attn = getattr(m, "attn", None)
    if not (type(m).__name__.endswith("MultiscaleDeformableAttention") and isinstance(attn, torch.nn.Module)
            and _has(m, _PROJECTIONS + ("n_heads", "n_levels", "n_points", "d_model"))
            and _params(m)[:9] == _OUTER_PARAMS):
        return False
    # The core module must be the stock one, unobserved: hooks on it would no longer run.
    if not (_is_hf_core(attn) or type(attn) is TransformersMultiScaleDeformableAttention) or _has_hooks(attn):
        return False
    try:
        source = "".join(inspect.getsource(type(m).forward).split())
    except (OSError, TypeError):
        return False
    return all(line in source for line in _OUTER_SOURCE_LINES)


# --- transformers: Mask2Former / OneFormer pixel-decoder attention (functional call) ------------

class TransformersPixelDecoderMultiscaleDeformableAttention(_DeformableLayer):
    """Replaces ``Mask2FormerPixelDecoderEncoderMultiscaleDeformableAttention`` and
    ``OneFormerPixelDecoderEncoderMultiscaleDeformableAttention``: their forward (transformers
    5.x), with ``multi_scale_deformable_attention(...)`` computed by opbridge. Both mask
    *padding* positions (attention_mask True = padding), unlike DeformableDetr's layer."""

    _signature: inspect.Signature  # set on each per-source subclass
    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                encoder_hidden_states: torch.Tensor | None = None, encoder_attention_mask: Any = None,
                position_embeddings: torch.Tensor | None = None, reference_points: torch.Tensor | None = None,
                *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        # Mask2Former: (..., spatial_shapes_list, level_start_index, output_attentions);
        # OneFormer: (..., spatial_shapes, level_start_index, output_attentions, spatial_shapes_list).
        bound = self._signature.bind(hidden_states, attention_mask, encoder_hidden_states, encoder_attention_mask,
                                     position_embeddings, reference_points, *args, **kwargs).arguments
        spatial_shapes: torch.Tensor | None = bound.get("spatial_shapes")
        spatial_shapes_list: Any = bound.get("spatial_shapes_list")
        if position_embeddings is not None:
            hidden_states = hidden_states + position_embeddings
        sequence_length = cast(torch.Tensor, encoder_hidden_states).shape[1]
        if spatial_shapes is None:
            spatial_shapes = torch.tensor([[int(h), int(w)] for h, w in spatial_shapes_list], dtype=torch.long,
                                          device=hidden_states.device)
            torch._check(sum(int(h) * int(w) for h, w in spatial_shapes_list) == sequence_length,
                         lambda: "Make sure to align the spatial shapes with the sequence length of the encoder "
                                 "hidden states")
        value = self.value_proj(encoder_hidden_states)
        if attention_mask is not None:
            value = value.masked_fill(attention_mask[..., None], float(0))
        return _attend(self, hidden_states, value, cast(torch.Tensor, reference_points), spatial_shapes,
                       _level_start_index(spatial_shapes), spatial_shapes_list)

    @classmethod
    def from_module(cls, m: torch.nn.Module) -> torch.nn.Module:
        # A per-source subclass keeps the original's forward signature for argument binding.
        sub = cast("type[TransformersPixelDecoderMultiscaleDeformableAttention]",
                   type(f"Opbridge{type(m).__name__}", (cls,), {"_signature": inspect.signature(type(m).forward)}))
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

class MSDeformAttn(_DeformableLayer):
    """Replaces Deformable-DETR's ``MSDeformAttn`` (d_model, n_levels, n_heads, n_points); its
    forward with ``MSDeformAttnFunction.apply`` computed by opbridge."""

    def forward(self, query: torch.Tensor, reference_points: torch.Tensor, input_flatten: torch.Tensor,
                input_spatial_shapes: torch.Tensor, input_level_start_index: torch.Tensor,
                input_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        value = self.value_proj(input_flatten)
        if input_padding_mask is not None:
            value = value.masked_fill(input_padding_mask[..., None], float(0))
        return _attend(self, query, value, reference_points, input_spatial_shapes, input_level_start_index)[0]


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

    # The original's attributes (shared __dict__).
    value_proj: torch.nn.Module
    sampling_offsets: torch.nn.Module
    attention_weights: torch.nn.Module
    output_proj: torch.nn.Module
    dropout: torch.nn.Module
    num_heads: int
    num_levels: int
    num_points: int
    batch_first: bool

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
        value = self.value_proj(value)
        if key_padding_mask is not None:
            value = value.masked_fill(key_padding_mask[..., None], 0.0)
        # spatial_shapes and level_start_index are required by the original too (None fails there as here).
        output, _ = _sample(query, value, cast(torch.Tensor, reference_points), cast(torch.Tensor, spatial_shapes),
                            cast(torch.Tensor, level_start_index), None, self.sampling_offsets,
                            self.attention_weights, self.num_heads, -1, self.num_levels, self.num_points)
        output = self.output_proj(output)
        if not self.batch_first:
            output = output.permute(1, 0, 2)
        return cast(torch.Tensor, self.dropout(output) + identity)


def _is_mmcv(m: torch.nn.Module) -> bool:
    return (type(m).__name__ == "MultiScaleDeformableAttention"
            and _has(m, _PROJECTIONS + ("num_heads", "num_levels", "num_points", "batch_first", "dropout"))
            and _params(m)[:9] == ("query", "key", "value", "identity", "query_pos", "key_padding_mask",
                                   "reference_points", "spatial_shapes", "level_start_index"))


# --- recognisers (combined with ms_deform_attn_per_level's in convert.py) ------------------------------

RECOGNISERS: tuple[tuple[Callable[[torch.nn.Module], bool], Callable[[torch.nn.Module], torch.nn.Module]], ...] = (
    (_is_hf_outer, lambda m: _shared(_subclass(type(m)), m)),
    (_is_hf_core, lambda m: _shared(TransformersMultiScaleDeformableAttention, m)),
    (_is_pixel_decoder, TransformersPixelDecoderMultiscaleDeformableAttention.from_module),
    (_is_msdeformattn, lambda m: _shared(MSDeformAttn, m)),
    (_is_mmcv, lambda m: _shared(MmcvMultiScaleDeformableAttention, m)),
)
REPLACED = (TransformersDeformableAttentionLayer, TransformersMultiScaleDeformableAttention,
            TransformersPixelDecoderMultiscaleDeformableAttention, MSDeformAttn, MmcvMultiScaleDeformableAttention)
