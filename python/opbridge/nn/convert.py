"""opbridge.nn.convert: swap torch.nn modules for their opbridge twins, and fuse a SiLU into the
GroupNorm before it where the module structure shows that nothing else reads the GroupNorm's
output (see docs/group_norm.md, "What convert fuses")."""

from __future__ import annotations

import collections
import inspect
import re
import warnings
from dataclasses import dataclass, field
from typing import Callable, Literal, cast, overload

import torch

from . import ms_deform_attn as _msda
from . import ms_deform_attn_per_level as _msda_per_level
from .group_norm import GroupNorm

# torch.nn module type -> its opbridge replacement (which has a from_torch classmethod).
_REPLACEMENTS: dict[type[torch.nn.Module], type[GroupNorm]] = {torch.nn.GroupNorm: GroupNorm}


# Multi-scale deformable attention: (recogniser, maker) pairs, tried in order, and the replacement
# classes (never replaced again).
_MSDA_RECOGNISERS = _msda.RECOGNISERS + _msda_per_level.RECOGNISERS
_MSDA_REPLACED = _msda.REPLACED + _msda_per_level.REPLACED
# Class names that suggest a deformable-attention module (for the warning about unknown variants).
_MSDA_NAME = re.compile(r"deform(able)?_?(attn|attention)", re.IGNORECASE)


def _replacement(m: torch.nn.Module) -> torch.nn.Module | None:
    repl = _REPLACEMENTS.get(type(m))
    if repl is not None:
        return repl.from_torch(cast(torch.nn.GroupNorm, m))
    if isinstance(m, _MSDA_REPLACED):
        return None
    for recognise, make in _MSDA_RECOGNISERS:
        if recognise(m):
            return make(m)
    return None


def _looks_like_msda(m: torch.nn.Module) -> bool:
    """True for a module whose class name says deformable attention (recognised or not)."""
    return bool(_MSDA_NAME.search(type(m).__name__)) and not isinstance(m, _MSDA_REPLACED)


@dataclass
class ConvertReport:
    """What :func:`convert` did (``convert(model, report=True)``); ``print`` it for a summary.

    model: the converted model (``model`` itself, or a new module where ``model`` was replaced).
    replaced: (module path, original class, opbridge class) for each module swapped ("" is the model).
    fused: paths of the GroupNorms a following SiLU was folded into.
    left: class names of deformable-attention modules of a form opbridge does not recognise (they
        run unchanged)."""

    model: torch.nn.Module
    replaced: list[tuple[str, str, str]] = field(default_factory=list)
    fused: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if not self.replaced and not self.fused and not self.left:
            return "opbridge.nn.convert: nothing to convert"
        counts = collections.Counter(old for _, old, _ in self.replaced)
        parts = [f"replaced {len(self.replaced)} module{'s' if len(self.replaced) != 1 else ''}"
                 + (f" ({', '.join(f'{name} x{n}' for name, n in sorted(counts.items()))})" if counts else "")]
        if self.fused:
            parts.append(f"fused a SiLU into {len(self.fused)} GroupNorm{'s' if len(self.fused) != 1 else ''}")
        if self.left:
            parts.append(f"left unconverted: {', '.join(sorted(set(self.left)))}")
        return "opbridge.nn.convert: " + "; ".join(parts)


@overload
def convert(model: torch.nn.Module, fuse_activations: bool = ..., *,
            report: Literal[False] = ...) -> torch.nn.Module: ...
@overload
def convert(model: torch.nn.Module, fuse_activations: bool = ..., *, report: Literal[True]) -> ConvertReport: ...
@overload
def convert(model: torch.nn.Module, fuse_activations: bool = ..., *,
            report: bool = ...) -> torch.nn.Module | ConvertReport: ...


def convert(model: torch.nn.Module, fuse_activations: bool = True, *,
            report: bool = False) -> torch.nn.Module | ConvertReport:
    """Replaces, in place, every module that opbridge provides a twin for by that twin sharing the
    same parameters, buffers and submodules (state_dict unchanged), and returns the model (a new
    module when ``model`` itself is one that gets replaced), or with ``report=True`` a
    :class:`ConvertReport` of what was replaced and fused (its ``model`` is the model). Covered:
    torch.nn.GroupNorm and the multi-scale deformable attention modules of transformers, mmcv and
    Deformable-DETR (see docs/ms_deform_attn.md). Only the model changes: no library function is
    patched. Deformable-attention modules of other, unrecognised designs are left as they are and
    named in one warning.

    With ``fuse_activations`` (default), a ``torch.nn.SiLU`` that is known to be applied to a
    GroupNorm's output and nothing else is folded into that GroupNorm
    (``opbridge.nn.GroupNorm(..., activation="silu")``) and replaced by ``torch.nn.Identity``:
    in ``torch.nn.Sequential`` (a GroupNorm directly followed by a SiLU), and in diffusers'
    ResnetBlock2D, Encoder, Decoder, UNet2DModel and UNet2DConditionModel (by their known
    forward code, see docs/group_norm.md). Parameters, state_dict keys and results are unchanged."""
    rep = ConvertReport(model)
    before = _silu_norms(model)
    new = _replacement(model)
    if new is not None:
        rep.model = new
        rep.replaced.append(("", type(model).__qualname__, type(new).__qualname__))
    else:
        if not _convert(model, "", rep, fuse_activations) and _looks_like_msda(model):
            rep.left.append(type(model).__qualname__)
        rep.fused = sorted(set(_silu_norms(model)) - set(before))
    if rep.left:
        warnings.warn("opbridge.nn.convert: left unconverted (deformable-attention modules of a form opbridge does "
                      f"not recognise; they run unchanged): {', '.join(sorted(set(rep.left)))}", stacklevel=2)
    return rep if report else rep.model


def _silu_norms(model: torch.nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, GroupNorm) and m.activation == "silu"]


def _convert(module: torch.nn.Module, prefix: str, rep: ConvertReport, fuse: bool) -> bool:
    """Converts module's descendants; True when any was replaced. A deformable-attention-looking
    module with nothing replaced inside it goes to ``rep.left``."""
    converted = False
    for name, child in module.named_children():
        new = _replacement(child)
        if new is not None:
            setattr(module, name, new)
            rep.replaced.append((f"{prefix}{name}", type(child).__qualname__, type(new).__qualname__))
            converted = True
            continue
        inner = _convert(child, f"{prefix}{name}.", rep, fuse)
        if not inner and _looks_like_msda(child):
            rep.left.append(type(child).__qualname__)
        converted = converted or inner
    if fuse:
        _fuse(module)
    return converted


def _is_gn(m: object) -> bool:
    return isinstance(m, GroupNorm) and m.activation == "none"


def _fused(gn: GroupNorm) -> GroupNorm:
    return GroupNorm.from_torch(gn, activation="silu")


def _fuse(model: torch.nn.Module) -> None:
    if isinstance(model, torch.nn.Sequential):
        _fuse_sequential(model)
        return
    rule = _DIFFUSERS_RULES.get(f"{type(model).__module__}.{type(model).__qualname__}")
    if rule is not None:
        rule(model)


def _fuse_sequential(seq: torch.nn.Sequential) -> None:
    # Sequential.forward feeds each module's output to the next one only.
    names = list(seq._modules)
    for a, b in zip(names, names[1:]):
        gn, act = seq._modules[a], seq._modules[b]
        if _is_gn(gn) and type(act) is torch.nn.SiLU:
            seq._modules[a] = _fused(cast(GroupNorm, gn))
            seq._modules[b] = torch.nn.Identity()


class _SiLULinear(torch.nn.Linear):
    """``Linear(SiLU(x))``, sharing a Linear's parameters (same state_dict keys): where a SiLU
    module that also served other inputs is folded into GroupNorms, its use on this Linear's
    input moves here."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(torch.nn.functional.silu(input), self.weight, self.bias)

    @classmethod
    def from_linear(cls, m: torch.nn.Linear) -> "_SiLULinear":
        new = cls.__new__(cls)
        new.__dict__.update(m.__dict__)
        return new


def _forward_source(model: torch.nn.Module) -> str:
    try:
        return inspect.getsource(type(model).forward)
    except (OSError, TypeError):
        return ""


def _fuse_resnet_block(block: torch.nn.Module) -> None:
    # diffusers' ResnetBlock2D.forward applies its one `nonlinearity` module three times:
    #   norm1 -> nonlinearity;  temb -> nonlinearity -> time_emb_proj (unless skip_time_act);
    #   norm2 (+ scale/shift for time_embedding_norm="scale_shift") -> nonlinearity.
    # The shared module is not changed: the block's attribute is rebound to Identity after its
    # uses move into norm1, norm2 and (for temb) a Linear that applies SiLU first. Only with
    # the forward code this was written against (checked: three calls of self.nonlinearity), a
    # SiLU nonlinearity, and no scale/shift between norm2 and the activation.
    src = _forward_source(block)
    if (src.count("self.nonlinearity(") != 3 or "hidden_states = self.norm1(hidden_states)\n" not in src
            or type(getattr(block, "nonlinearity", None)) is not torch.nn.SiLU
            or getattr(block, "time_embedding_norm", None) == "scale_shift"
            or not (_is_gn(getattr(block, "norm1", None)) and _is_gn(getattr(block, "norm2", None)))):
        return
    proj = getattr(block, "time_emb_proj", None)
    if proj is not None and not getattr(block, "skip_time_act", False):
        if type(proj) is not torch.nn.Linear:
            return
        block.time_emb_proj = _SiLULinear.from_linear(proj)
    block.norm1 = _fused(cast(GroupNorm, block.norm1))
    block.norm2 = _fused(cast(GroupNorm, block.norm2))
    block.nonlinearity = torch.nn.Identity()


def _fuse_norm_out(model: torch.nn.Module) -> None:
    # Encoder / Decoder / UNet2DModel / UNet2DConditionModel: `sample = self.conv_norm_out(sample)`
    # directly followed by `sample = self.conv_act(sample)`, conv_act's only use.
    src = _forward_source(model)
    lines = [ln.strip() for ln in src.splitlines() if ln.strip()]
    uses = [i for i, ln in enumerate(lines) if "self.conv_act(" in ln]
    if (len(uses) != 1 or uses[0] == 0 or "self.conv_norm_out(" not in lines[uses[0] - 1]
            or not _is_gn(getattr(model, "conv_norm_out", None))
            or type(getattr(model, "conv_act", None)) is not torch.nn.SiLU):
        return
    model.conv_norm_out = _fused(cast(GroupNorm, model.conv_norm_out))
    model.conv_act = torch.nn.Identity()


_DIFFUSERS_RULES: dict[str, Callable[[torch.nn.Module], None]] = {
    "diffusers.models.resnet.ResnetBlock2D": _fuse_resnet_block,
    "diffusers.models.autoencoders.vae.Encoder": _fuse_norm_out,
    "diffusers.models.autoencoders.vae.Decoder": _fuse_norm_out,
    "diffusers.models.unets.unet_2d.UNet2DModel": _fuse_norm_out,
    "diffusers.models.unets.unet_2d_condition.UNet2DConditionModel": _fuse_norm_out,
}
