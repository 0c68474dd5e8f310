"""Which input dimensions ``opbridge.onnx.export`` makes dynamic: pure functions from the example
inputs and the caller's export arguments to the ``dynamic_shapes`` (dynamo exporter) or
``dynamic_axes`` (TorchScript exporter) to use, plus the warnings to give.

The rule (``dynamic_batch=True``, the caller passing neither ``dynamic_shapes`` nor ``dynamic_axes``):
the example batch is dim 0 of the first tensor input (of rank >= 1). Dim 0 of that input and of
every other tensor input whose dim 0 has the same size becomes one dynamic dimension named
``batch``; every other dimension stays static. So a per-sample input such as diffusers' ``timestep``
(shape (B,)) is dynamic with the batch, while a weight passed as an input, of another length, keeps
its size. A parameter-like input (an ``nn.Parameter``, a tensor that requires grad, or one whose
argument name says weight/bias/scale/...) whose length merely equals the example batch stays
static too, with a warning: treating it as batch-sized would tie it to the batch (and usually
fail inside torch.export, where it meets a static size). Export with an example batch of another
size, or pass ``dynamic_shapes`` / ``dynamic_axes``, to decide otherwise.

Dynamic shapes the caller passes are used as given, after a check against the example inputs that
turns the usual mistakes (wrong number of entries, unknown input names, an axis past an input's
rank, one Dim for axes of different example sizes, both dynamic_shapes and dynamic_axes,
dynamic_shapes for the TorchScript exporter) into one clear ValueError instead of a failure deep
inside torch.export.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

BATCH = "batch"

# Argument names of parameter-like inputs (matched as whole words of snake_case names).
_PARAM_NAME = re.compile(
    r"(^|_)(weights?|bias(es)?|scales?|shifts?|gamma|beta|alpha|running_(mean|var)|params?|parameters?|"
    r"coefs?|coeffs?|coefficients?|kernels?)($|_)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Plan:
    """What export passes to torch.onnx.export for dynamic dimensions.

    kwargs: entries to add to the exporter's keyword arguments ({"dynamic_shapes": ...} or
        {"dynamic_axes": ...}; empty when nothing is added).
    dynamic: names of the inputs whose dim 0 opbridge made dynamic (empty when the caller's own
        shapes are used or dynamic_batch is False).
    warnings: messages to give the caller (UserWarning).
    """

    kwargs: dict[Any, Any] = field(default_factory=dict)
    dynamic: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def warn(self, stacklevel: int = 3) -> None:
        for message in self.warnings:
            warnings.warn(message, UserWarning, stacklevel=stacklevel)

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """Silences torch's note that the axis name "batch" "will not be used" for the second and
        later inputs that share it: sharing one batch dimension is the point of the plan, so the
        note says nothing to the caller. (The caller's own dynamic shapes keep torch's notes.)"""
        with warnings.catch_warnings():
            if len(self.dynamic) > 1:
                warnings.filterwarnings("ignore", message=rf"# The axis name: {BATCH} will not be used")
            yield


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _parameter_like(value: Any, name: str) -> bool:
    import torch

    return isinstance(value, torch.nn.Parameter) or bool(value.requires_grad) or bool(_PARAM_NAME.search(name))


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in value.shape)


def plan(args: Sequence[Any], names: Sequence[str], export_kwargs: dict[Any, Any], *, dynamo: bool,
         dynamic_batch: bool) -> Plan:
    """The dynamic dimensions of an export of ``model(*args)``.

    args: the example inputs (positional; non-tensors allowed).
    names: one name per entry of args (the model's forward argument names, or input_names).
    export_kwargs: the caller's keyword arguments for torch.onnx.export (read, never changed).
    dynamo: which exporter (dynamic_shapes is for the dynamo exporter only).
    dynamic_batch: opbridge's rule on (see the module docstring) unless the caller passes shapes.
    """
    names = list(names)[: len(args)] + [f"input_{i}" for i in range(len(names), len(args))]
    user_shapes = export_kwargs.get("dynamic_shapes")
    user_axes = export_kwargs.get("dynamic_axes")
    if user_shapes is not None and user_axes is not None:
        raise ValueError("pass either dynamic_shapes (dynamo exporter) or dynamic_axes, not both")
    if user_shapes is not None:
        if not dynamo:
            raise ValueError("dynamic_shapes is for the dynamo exporter; with dynamo=False pass dynamic_axes "
                             "({input name: {axis: name}})")
        check_dynamic_shapes(user_shapes, args, names)
    if user_axes is not None:
        check_dynamic_axes(user_axes, args, names)
    # The caller decides as soon as either argument is there (None too: static).
    if not dynamic_batch or "dynamic_shapes" in export_kwargs or "dynamic_axes" in export_kwargs:
        return Plan()

    tensors = [i for i, a in enumerate(args) if _is_tensor(a) and a.dim() > 0]
    if not tensors:
        return Plan()
    first = tensors[0]
    batch = int(args[first].shape[0])
    dynamic, notes = [first], []
    for i in tensors[1:]:
        if int(args[i].shape[0]) != batch:
            continue  # another length: not per-sample (a weight, a table), stays static
        if _parameter_like(args[i], names[i]):
            notes.append(
                f"opbridge.onnx.export: input {names[i]!r} (shape {_shape(args[i])}) looks like a parameter, and its "
                f"length {batch} equals the example batch (dim 0 of {names[first]!r}, shape {_shape(args[first])}) "
                f"by chance, so it is kept static. If it is per-sample, export with dynamic_shapes / dynamic_axes; "
                f"if it is a parameter, an example batch of another size avoids this warning.")
            continue
        dynamic.append(i)
    dyn_names = tuple(names[i] for i in dynamic)
    if dynamo:
        import torch

        dim = torch.export.Dim(BATCH)
        shapes = tuple({0: dim} if i in dynamic else None for i in range(len(args)))
        return Plan({"dynamic_shapes": shapes}, dyn_names, tuple(notes))
    return Plan({"dynamic_axes": {names[i]: {0: BATCH} for i in dynamic}}, dyn_names, tuple(notes))


def group_var_positional(kwargs: dict[Any, Any], start: int | None) -> dict[Any, Any]:
    """The plan's dynamic_shapes for a forward(self, a, *rest): torch.export takes one entry per
    parameter, so the entries of the inputs from `start` on go into one tuple (that of *rest)."""
    shapes = kwargs.get("dynamic_shapes")
    if start is None or not isinstance(shapes, tuple):
        return kwargs
    return {**kwargs, "dynamic_shapes": (*shapes[:start], tuple(shapes[start:]))}


def _describe(value: Any) -> str:
    return f"shape {_shape(value)}" if _is_tensor(value) else f"a {type(value).__name__}"


def check_dynamic_shapes(shapes: Any, args: Sequence[Any], names: Sequence[str]) -> None:
    """Checks the caller's dynamic_shapes against the example inputs; raises ValueError naming the
    input, the axis and what was expected. Only the top level (one entry per positional input) is
    checked; nested structures are left to torch.export."""
    if isinstance(shapes, dict):
        unknown = [k for k in shapes if k not in names]
        if unknown:
            raise ValueError(f"dynamic_shapes names unknown inputs {unknown}; the model's inputs are {list(names)}")
        entries = [(names.index(k), v) for k, v in shapes.items()]
    elif isinstance(shapes, (tuple, list)):
        if len(shapes) != len(args):
            raise ValueError(f"dynamic_shapes has {len(shapes)} entries, but the model gets {len(args)} inputs "
                             f"{list(names)}: give one entry per input (None for a static one)")
        entries = list(enumerate(shapes))
    else:
        raise ValueError(f"dynamic_shapes must be a tuple/list (one entry per input) or a dict keyed by input "
                         f"name, got {type(shapes).__name__}")
    sizes: dict[str, tuple[int, str, int]] = {}  # Dim name -> (example size, input, axis) first seen
    for i, spec in entries:
        if spec is None:
            continue
        if isinstance(spec, dict):
            axes = list(spec.items())
        elif isinstance(spec, (tuple, list)):
            if not _is_tensor(args[i]):
                continue  # a nested structure: torch.export checks it
            axes = [(a, d) for a, d in enumerate(spec) if d is not None]
            if len(spec) != args[i].dim():
                raise ValueError(f"dynamic_shapes[{names[i]!r}] has {len(spec)} entries, but {names[i]!r} has rank "
                                 f"{args[i].dim()} ({_describe(args[i])})")
        else:
            continue
        if axes and not _is_tensor(args[i]):
            raise ValueError(f"dynamic_shapes[{names[i]!r}] marks axes dynamic, but input {names[i]!r} is "
                             f"{_describe(args[i])}, not a tensor")
        for axis, dim in axes:
            rank = args[i].dim()
            if not isinstance(axis, int) or not -rank <= axis < rank:
                raise ValueError(f"dynamic_shapes[{names[i]!r}] marks axis {axis!r} dynamic, but {names[i]!r} has "
                                 f"rank {rank} ({_describe(args[i])})")
            dim_name = getattr(dim, "__name__", None)
            if dim_name is None or not hasattr(dim, "min"):
                continue  # Dim.AUTO / Dim.DYNAMIC / STATIC hints: torch.export decides
            size = int(args[i].shape[axis])
            if dim_name in sizes and sizes[dim_name][0] != size:
                s0, n0, a0 = sizes[dim_name]
                raise ValueError(
                    f"dynamic_shapes uses Dim {dim_name!r} for axis {a0} of {n0!r} (size {s0} in the example) and "
                    f"for axis {axis} of {names[i]!r} (size {size}): one Dim stands for one size; give them "
                    f"separate Dims, or make the example sizes equal")
            sizes.setdefault(dim_name, (size, names[i], axis))


def check_dynamic_axes(axes: Any, args: Sequence[Any], names: Sequence[str]) -> None:
    """Checks the caller's dynamic_axes ({name: {axis: dim name} or [axes]}) for the inputs; names
    that are not inputs are left alone (they may be outputs)."""
    if not isinstance(axes, dict):
        raise ValueError(f"dynamic_axes must be a dict {{input or output name: {{axis: name}}}}, got "
                         f"{type(axes).__name__}")
    for key, spec in axes.items():
        if key not in names:
            continue
        i = list(names).index(key)
        if not _is_tensor(args[i]):
            raise ValueError(f"dynamic_axes[{key!r}]: input {key!r} is {_describe(args[i])}, not a tensor")
        rank = args[i].dim()
        for axis in (spec.keys() if isinstance(spec, dict) else spec):
            if not isinstance(axis, int) or not -rank <= axis < rank:
                raise ValueError(f"dynamic_axes[{key!r}] marks axis {axis!r} dynamic, but {key!r} has rank {rank} "
                                 f"({_describe(args[i])})")
