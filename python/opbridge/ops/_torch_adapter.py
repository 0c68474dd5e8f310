"""What torch needs of a declared op beyond its C++ kernels, derived from the declaration:

* the fake (meta) kernel: the declaration's own checks (the C++ routine the kernels run, called
  through the library's C ABI: opbridge._core for opbridge's ops) on every size that is known, and the output rule evaluated on the
  input sizes, so that symbolic sizes stay symbolic under torch.export / torch.compile;
* the autograd formula of an op that has a declared backward op (OpDecl.gradient_of): first-order
  gradients are what that op returns (:func:`register_gradient`; register_library_ops does it
  for every such op that registered no formula of its own);
* autograd safety: :func:`register_autograd` registers a backward formula and, unless the
  formula is itself differentiable (or a differentiable form of the op is given for higher
  orders), makes second-order gradients a clear error instead of silently treating the
  first-order gradient as a constant; a declared op with no formula at all raises a clear error
  on backward. :func:`gradient_order` says which orders an op implements (opbridge.testing uses it).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, cast

import torch

from .._declarations import CheckError, InputDecl, MisdeclaredOpError, OpDecl
from .._op_library import OpLibrary

__all__ = ["gradient_order", "no_grad_fast_path", "register_autograd", "register_gradient", "register_library_ops",
           "signature"]

_TORCH_ELEM = {
    torch.float32: 1, torch.uint8: 2, torch.int8: 3, torch.int16: 5, torch.int32: 6, torch.int64: 7,
    torch.bool: 9, torch.float16: 10, torch.float64: 11, torch.complex64: 14, torch.complex128: 15,
    torch.bfloat16: 16,
}

_done: set[str] = set()
# Ops with a formula registered through register_formula (their own, or register_autograd's).
_formulas: set[str] = set()
# qualname -> the highest order of gradients implemented (0: none; 1: first; 2: any order).
_orders: dict[str, int] = {}
# qualname -> the differentiable form of the op given as double_backward (for opbridge.testing).
_differentiable: dict[str, Callable[..., Any]] = {}


def gradient_order(qualname: str) -> int | None:
    """0 when the op has no gradient formula, 1 when only first-order gradients are implemented
    (differentiating them raises NotImplementedError), 2 when gradients of every order are;
    None when nothing registered with opbridge knows the op."""
    return _orders.get(qualname)


def differentiable_form(qualname: str) -> Callable[..., Any] | None:
    """The torch-ops form of the op given to register_autograd(double_backward=...), if any."""
    return _differentiable.get(qualname)


def signature(op: OpDecl) -> inspect.Signature:
    return op.signature()


def _dims(t: torch.Tensor) -> list[int]:
    # A symbolic size is "unknown" to the checks (they run again on real sizes in the kernel).
    return [d if isinstance(d, int) else -1 for d in t.shape]


def _check(op: OpDecl, bound: inspect.BoundArguments) -> None:
    qual = op.qualname
    first = None
    for decl in op.check_order:
        t = bound.arguments[decl.name]
        if t is not None and not decl.host_memory:
            if first is None:
                first = (decl, t)
            elif t.device != first[1].device:
                raise ValueError(f"{qual}: {decl.name} must be on {first[0].name}'s device ({first[1].device}), "
                                 f"got {t.device}")
    inputs = []
    for decl in op.inputs:
        t = bound.arguments[decl.name]
        inputs.append(None if t is None else (_TORCH_ELEM.get(t.dtype, 0), _dims(t)))
    attrs = {a.name: bound.arguments[a.name] for a in op.attrs}
    try:
        op.check(inputs, attrs)
    except CheckError as e:
        raise e.exception(qual) from None


_TORCH_DTYPES = {1: torch.float32, 6: torch.int32, 7: torch.int64, 10: torch.float16, 11: torch.float64,
                 16: torch.bfloat16}


def _output(op: OpDecl, k: int, bound: inspect.BoundArguments) -> torch.Tensor:
    out = op.outputs[k]
    tensors = [bound.arguments[i.name] for i in op.inputs]
    dtype = next((t.dtype for i, t in zip(op.inputs, tensors) if t is not None and i.type_var == out.type_var),
                 None)
    if dtype is None:  # a type variable of one type, bound by no input (int64 indices)
        dtype = _TORCH_DTYPES[op.types[out.type_var][0]]
    if out.like >= 0:
        like = tensors[out.like]
        if out.keeps_memory_format and channels_last(like):
            # (N, *spatial, C) memory, the rule the kernels follow (any rank >= 3).
            order = (0, *range(2, like.dim()), 1)
            inverse = sorted(range(like.dim()), key=order.__getitem__)
            return cast(torch.Tensor, like.new_empty([like.shape[i] for i in order], dtype=dtype).permute(inverse))
        return torch.empty(like.shape, dtype=dtype, device=like.device)
    shape = out.sizes(lambda index, dim: tensors[index].shape[dim], lambda k: bound.arguments[op.attrs[k].name],
                      lambda: torch.library.get_ctx().new_dynamic_size())
    anchor = next(t for t in tensors if t is not None)
    return cast(torch.Tensor, anchor.new_empty(shape, dtype=dtype))


def channels_last(x: torch.Tensor) -> bool:
    """Whether x's memory is channels-last, (N, *spatial, C), and not also contiguous (where both
    hold, e.g. C = 1, the layouts coincide): then ops whose output keeps_memory_format() give a
    channels-last result (torch_common.h's uses_channels_last is the C++ side of this rule).

    A single sample (N = 1) counts only when its batch stride is at least the sample's size, as
    in a channels-last batch or a slice of one: torch's own rule (suggest_memory_format), under
    which e.g. the (C, 1, W * C, C)-strided view an attention block returns is contiguous-like,
    and torch's F.group_norm and convolutions give contiguous results for it."""
    if x.dim() < 3 or x.is_contiguous() or not x.permute(0, *range(2, x.dim()), 1).is_contiguous():
        return False
    return x.shape[0] != 1 or x.stride(0) >= x.numel()


# qualname -> the fake kernel a user supplied (register_fake): it runs after the declaration's checks.
_user_fakes: dict[str, Callable[..., Any]] = {}


def register_fake(qualname: str, fn: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """Supplies the fake kernel (meta function: output shapes, dtypes and devices, no data) of a
    declared op whose output rule cannot describe its outputs; usable as a decorator. ``fn`` gets the
    op's arguments (fake tensors, as torch.library.register_fake's functions do; sizes may be
    symbolic, ``torch.library.get_ctx().new_dynamic_size()`` gives a data-dependent one) and returns
    the output tensor(s). The declaration's checks still run first, so bad input gets the same
    verdict as in the kernels. Takes effect at once, also for ops already registered."""
    def register(f: Callable[..., Any]) -> Callable[..., Any]:
        _user_fakes[qualname] = f
        return f

    return register(fn) if fn is not None else register


def _make_fake(op: OpDecl) -> Callable[..., Any]:
    sig = signature(op)

    def fake(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        _check(op, bound)
        user = _user_fakes.get(op.qualname)
        if user is not None:
            return user(*bound.args)
        outs = tuple(_output(op, k, bound) for k in range(len(op.outputs)))
        return outs[0] if len(outs) == 1 else outs

    fake.__name__ = f"{op.name}_fake"
    return fake


class _NoDoubleBackward(torch.autograd.Function):
    """Identity on the first-order gradients; raises if anything differentiates through them."""

    @staticmethod
    def forward(ctx: Any, name: str, anchor: torch.Tensor, *grads: torch.Tensor) -> Any:
        ctx.name = name
        return tuple(g.view_as(g) for g in grads)

    @staticmethod
    def backward(ctx: Any, *unused: Any) -> Any:
        raise NotImplementedError(
            f"second-order gradients of {ctx.name} are not implemented (its backward is not differentiable); "
            "first-order gradients are"
        )


def register_autograd(qualname: str, backward: Callable[..., Any], *, setup_context: Callable[..., Any],
                      double_backward: bool | Callable[..., Any] = False, backward_op: str | None = None,
                      backward_op_grads: tuple[int, ...] | list[int] | None = None) -> None:
    """``torch.library.register_autograd`` for an op of ours or yours, never silently wrong at
    second order. ``double_backward``:

    * False: ``backward`` runs a kernel that has no gradient of its own; differentiating the
      gradients (``create_graph=True``) raises NotImplementedError naming the op;
    * True: ``backward`` is made of differentiable torch ops;
    * a function: the op written with differentiable torch ops, with the op's signature. First-order
      gradients come from ``backward`` (your kernel); where the gradients must themselves be
      differentiable (``create_graph=True``: double backward, Hessian-vector products), they are
      computed by differentiating this function at the op's inputs instead.

    ``backward_op`` (with ``backward_op_grads``): where first-order gradients are what the op
    ``backward_op(*grad_outputs, *args)`` returns, namely the gradients of the op's arguments at
    the indices ``backward_op_grads``, in order, the autograd graph is built in C++ and that op
    is called directly, with no Python in either pass (the formula still serves
    ``create_graph=True``, through a recomputation of the op, and devices the C++ kernel does
    not cover). ``backward`` must compute the same gradients. Of a declared op, the backward op
    must be declared from it (``args_of`` or ``gradient_of``): the op's checks then run on its
    arguments before its kernel, in torch, its fake kernel, ONNX Runtime and opbridge._core;
    another is refused (ValueError naming both ops).
    """
    if backward_op is not None and backward_op_grads is None:
        raise TypeError(f"register_autograd({qualname!r}): backward_op needs backward_op_grads, the indices of "
                        "the arguments whose gradients it returns")
    _check_backward_op(f"register_autograd({qualname!r})", qualname, backward_op)
    if callable(double_backward):
        _register_with_differentiable_form(qualname, backward, setup_context, double_backward)
        _differentiable[qualname] = double_backward
    elif double_backward:
        register_formula(qualname, backward, setup_context)
    else:

        def guarded(ctx: Any, *grads: Any) -> Any:
            result = backward(ctx, *grads)
            if not torch.is_grad_enabled():
                return result
            # Something that requires grad makes the guard part of the graph even where the
            # kernel's gradients do not require grad (they would be silent constants otherwise).
            anchors = [g for g in grads if isinstance(g, torch.Tensor) and g.requires_grad]
            anchors += [t for t in getattr(ctx, "saved_tensors", ()) if t is not None and t.requires_grad]
            if not anchors:
                return result
            single = not isinstance(result, tuple)
            items = (result,) if single else result
            idx = [i for i, g in enumerate(items) if isinstance(g, torch.Tensor)]
            wrapped = list(items)
            # torch's autograd.Function.apply is untyped.
            guarded_grads = _NoDoubleBackward.apply(  # type: ignore[no-untyped-call]
                qualname, anchors[0], *[items[i] for i in idx])
            for i, g in zip(idx, guarded_grads):
                wrapped[i] = g
            return wrapped[0] if single else tuple(wrapped)

        register_formula(qualname, guarded, setup_context)
    _orders[qualname] = 2 if double_backward else 1
    if backward_op is not None:
        if hasattr(torch.ops.opbridge, "_cpp_autograd"):
            torch.ops.opbridge._cpp_autograd(qualname, backward_op,
                                             [int(i) for i in cast("tuple[int, ...] | list[int]", backward_op_grads)])


def _declaration_of(qualname: str) -> tuple[OpLibrary | None, OpDecl | None]:
    """(the library, the declaration) of op ``namespace::name`` among the libraries opbridge
    knows: (lib, None) for an op its library refuses as misdeclared, (None, None) for one no
    library declares."""
    ns, _, name = qualname.rpartition("::")
    for lib in _libraries():
        if lib.namespace == ns and (name in lib.ops or name in lib.refused):
            return lib, lib.ops.get(name)
    return None, None


def _check_backward_op(where: str, qualname: str, backward_op: str | None) -> None:
    """Refuses a backward op of a declared op that would not run the op's checks on its arguments:
    every adapter (ONNX Runtime's too) learns which op a backward is of from the backward's
    declaration alone (args_of or gradient_of), so one declared otherwise would let a bad argument
    through to its kernel wherever it is called directly."""
    lib, fwd = _declaration_of(qualname)
    if lib is None:
        return  # not a declared op: nothing opbridge checks
    if fwd is None:
        raise cast(MisdeclaredOpError, lib.misdeclared([qualname.rpartition("::")[2]]))
    if backward_op is None:
        return
    blib, bwd = _declaration_of(backward_op)
    if blib is not None and bwd is None:
        raise cast(MisdeclaredOpError, blib.misdeclared([backward_op.rpartition("::")[2]]))
    how = f"declare it from {fwd.name}'s declaration with .args_of(...) (or .gradient_of(...)), which adds them all"
    if bwd is None:
        raise ValueError(f"{where}: backward_op {backward_op} is not an op a library opbridge knows declares, so "
                         f"{qualname}'s checks cannot run on its arguments before its kernel: {how}")
    if blib is lib and bwd.forward == fwd.name:
        return
    missing = [a.name for a in fwd.args if not any(b.name == a.name and type(b) is type(a) for b in bwd.args)]
    if missing:
        raise ValueError(f"{where}: backward_op {backward_op} cannot be checked as the backward of {qualname}: "
                         f"its arguments do not include {fwd.name}'s {', '.join(missing)}, so {fwd.name}'s checks "
                         f"cannot run on them before its kernel; {how}")
    raise ValueError(f"{where}: backward_op {backward_op} does not run {qualname}'s checks on its arguments: its "
                     f"declaration takes them, but not from {fwd.name} ({backward_op} declares "
                     f"{'no forward' if bwd.forward is None else 'the forward ' + bwd.forward}); {how}, so that "
                     f"torch, its fake kernel, ONNX Runtime and opbridge._core check them before its kernel runs")


def register_formula(qualname: str, backward: Callable[..., Any], setup_context: Callable[..., Any]) -> None:
    """``torch.library.register_autograd`` followed by :func:`no_grad_fast_path`: every formula
    opbridge registers goes through here."""
    torch.library.register_autograd(qualname, backward, setup_context=setup_context)
    _formulas.add(qualname)
    no_grad_fast_path(qualname)


def no_grad_fast_path(qualname: str) -> None:
    """After ``torch.library.register_autograd(qualname, ...)``: calls where no gradient is
    needed (grad mode off, or no tensor argument requires grad) go from the dispatcher straight
    to the op's kernels, in C++, instead of through the formula's Python autograd kernel (about
    6 us per call); calls that need gradients still run the formula. A no-op where this build
    has no torch extension."""
    if hasattr(torch.ops.opbridge, "_no_grad_fast_path"):
        torch.ops.opbridge._no_grad_fast_path(qualname)


def _register_with_differentiable_form(qualname: str, backward: Callable[..., Any], setup_context: Callable[..., Any],
                                       form: Callable[..., Any]) -> None:
    def setup(ctx: Any, inputs: Any, output: Any) -> None:
        setup_context(ctx, inputs, output)
        # The inputs themselves (not detached copies): differentiating `form` at them connects
        # the gradients to the graph that produced them. Their versions guard against in-place
        # changes between forward and backward, as saved tensors are guarded.
        ctx._opbridge_inputs = tuple(inputs)
        ctx._opbridge_versions = tuple(t._version if isinstance(t, torch.Tensor) else None for t in inputs)

    def wrapped(ctx: Any, *grads: Any) -> Any:
        if not torch.is_grad_enabled():
            return backward(ctx, *grads)
        inputs = ctx._opbridge_inputs
        for t, v in zip(inputs, ctx._opbridge_versions):
            if isinstance(t, torch.Tensor) and t._version != v:
                raise RuntimeError(f"{qualname}: an input of the forward was modified in place before backward; "
                                   "its gradients would be wrong")
        wanted = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and ctx.needs_input_grad[i]]
        result: list[torch.Tensor | None] = [None] * len(inputs)
        if not wanted:
            return tuple(result)
        with torch.enable_grad():
            outs = form(*inputs)
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and isinstance(o, torch.Tensor) and o.requires_grad]
        if not pairs:
            return tuple(result)
        got = torch.autograd.grad([o for o, _ in pairs], [inputs[i] for i in wanted], [g for _, g in pairs],
                                  create_graph=True, allow_unused=True)
        for i, g in zip(wanted, got):
            result[i] = g
        return tuple(result)

    register_formula(qualname, wrapped, setup)


def restricted(fn: Callable[..., Any], op: OpDecl, what: str) -> Callable[..., Any]:
    """``fn`` (a torch-ops form of ``op``, with a signature of its own) called with a call of
    ``op``: every argument the call leaves out gets the declaration's default (torch's dispatcher
    leaves out trailing arguments equal to their defaults when it calls a Python kernel, e.g. a
    composite registered for CUDA), the arguments ``fn`` does not take are left out where they have
    their default values, and a call that sets one otherwise is a clear NotImplementedError (an
    argument added to the declaration after ``fn`` was written must not be silently ignored)."""
    import inspect

    sig = op.signature()
    try:
        takes = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return fn
    missing = [a for a in op.args if a.name not in takes]

    def call(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        for a in missing:
            value = bound.arguments[a.name]
            if isinstance(a, InputDecl):
                if value is not None:
                    raise NotImplementedError(f"{op.qualname}: {what} does not take the input {a.name}")
            elif not a.is_default(value):
                raise NotImplementedError(f"{op.qualname}: {what} does not take {a.name} (= {value!r}, the "
                                          f"default is {a.default!r})")
        return fn(**{k: v for k, v in bound.arguments.items() if k in takes})

    call.__name__ = getattr(fn, "__name__", "form")
    return call


def register_gradient(qualname: str, *, differentiable: Callable[..., Any] | None = None) -> None:
    """The autograd formula of the declared op ``qualname`` from its declared backward op (the op
    whose declaration says ``gradient_of`` it): its first-order gradients are what the backward
    op returns (computed in C++ where the fast-path library is loaded, as with
    :func:`register_autograd`'s ``backward_op``); without ``differentiable``, differentiating
    them again raises NotImplementedError naming the op.

    differentiable: the backward op written with differentiable torch ops (its arguments: the
        backward op's: gradients, forward outputs and the op's arguments), used where the
        gradients must themselves be differentiable (create_graph=True), so that gradients of
        every order exist. Arguments of the declaration
        it does not take must have their default values there (else NotImplementedError)."""
    ns, name = qualname.split("::", 1)
    lib, op = _declaration_of(qualname)
    if lib is None:
        raise ValueError(f"register_gradient: no library opbridge knows declares {qualname}")
    if op is None:
        raise cast(MisdeclaredOpError, lib.misdeclared([name]))
    bwd = lib.backward_of(name)
    if bwd is None:
        raise ValueError(f"register_gradient: {qualname} has no declared backward op (an op whose declaration is "
                         "gradient_of it)")
    positions = [next(k for k, a in enumerate(op.args) if a.name == w)
                 for w in cast("tuple[Any, ...]", bwd.gradient_of)[1]]
    backward_op = getattr(getattr(torch.ops, ns), bwd.name).default
    form = restricted(differentiable, bwd, "its differentiable backward") if differentiable is not None else None
    # Where the backward op's arguments are each output's gradient, then the op's arguments, the
    # graph can be built in C++ (register_autograd's backward_op); one that skips outputs without
    # a gradient or takes forward outputs runs through this formula.
    diff = [k for k, o in enumerate(op.outputs) if o.differentiable]
    saved_outputs = sorted({a.forward_output for a in bwd.inputs if a.forward_output >= 0})
    plain = (len(diff) == len(op.outputs) and not saved_outputs
             and [a.name for a in bwd.args] == [a.name for a in bwd.inputs if a.gradient] + [a.name for a in op.args])
    # Where each argument of the backward op comes from: ("grad", k) the gradient of output k,
    # ("out", k) output k, ("arg", k) the op's argument k.
    grad_iter = iter(diff)
    sources: list[tuple[str, int]] = []
    for a in bwd.args:
        if isinstance(a, InputDecl) and a.gradient:
            sources.append(("grad", next(grad_iter)))
        elif isinstance(a, InputDecl) and a.forward_output >= 0:
            sources.append(("out", a.forward_output))
        else:
            sources.append(("arg", next(k for k, f in enumerate(op.args) if f.name == a.name)))
    no_grad_outputs = [k for k, o in enumerate(op.outputs) if not o.differentiable]

    def setup(ctx: Any, inputs: Any, output: Any) -> None:
        outs = output if isinstance(output, tuple) else (output,)
        tensors = [k for k, v in enumerate(inputs) if isinstance(v, torch.Tensor)]
        ctx.save_for_backward(*[inputs[k] for k in tensors], *[outs[k] for k in saved_outputs])
        ctx.opbridge_tensors = tensors
        ctx.opbridge_others = [None if isinstance(v, torch.Tensor) else v for v in inputs]
        # Floating outputs declared not_differentiable (integer ones are so for torch already).
        marked = [outs[k] for k in no_grad_outputs if outs[k].is_floating_point()]
        if marked:
            ctx.mark_non_differentiable(*marked)

    def backward(ctx: Any, *grads: Any) -> Any:
        args = list(ctx.opbridge_others)
        saved = ctx.saved_tensors
        for k, t in zip(ctx.opbridge_tensors, saved):
            args[k] = t
        outs = dict(zip(saved_outputs, saved[len(ctx.opbridge_tensors):]))
        call = [grads[k] if kind == "grad" else outs[k] if kind == "out" else args[k] for kind, k in sources]
        if form is not None and torch.is_grad_enabled():
            got = form(*call)
        else:
            got = backward_op(*call)
        got = got if isinstance(got, (tuple, list)) else (got,)
        result: list[torch.Tensor | None] = [None] * len(args)
        for k, g in zip(positions, got):
            if args[k] is not None and ctx.needs_input_grad[k]:
                result[k] = g
        return tuple(result)

    register_autograd(qualname, backward, setup_context=setup, double_backward=form is not None,
                      backward_op=f"{ns}::{bwd.name}" if plain else None,
                      backward_op_grads=positions if plain else None)
    if not plain:
        _check_backward_op(f"register_gradient({qualname!r})", qualname, f"{ns}::{bwd.name}")


def _libraries() -> list[OpLibrary]:
    from .._op_library import libraries

    return libraries()


def _no_gradient(qualname: str) -> None:
    def setup(ctx: Any, inputs: Any, output: Any) -> None:
        pass

    def backward(ctx: Any, *grads: Any) -> Any:
        raise NotImplementedError(f"{qualname} has no gradient formula (it is not differentiable in opbridge)")

    register_formula(qualname, backward, setup)
    _orders[qualname] = 0


def register_library_ops(lib: OpLibrary) -> None:
    """Registers, for every declared op of ``lib`` whose torch op exists, the fake kernel from
    its declaration and — where nothing registered a gradient formula — a backward that raises.
    Loads the library's torch extension first where it has one (``torch_path``). Idempotent.
    Where the library refuses an op's declaration, raises MisdeclaredOpError naming it, after the
    others are registered (they work)."""
    if lib.namespace is None:
        return
    if lib.torch_path is not None:
        lib.load_torch()
        ns = getattr(torch.ops, lib.namespace)
        if lib.ops and not any(hasattr(ns, op.name) for op in lib.ops.values()):
            raise ValueError(f"{lib.torch_path} defines none of its library's ops ({', '.join(sorted(lib.ops))}) in "
                             f"torch namespace {lib.namespace!r}: is the namespace the one the library was built "
                             "with (opbridge_add_op's NAMESPACE)?")
    for op in lib.ops.values():
        qual = op.qualname
        if qual in _done:
            continue
        try:
            getattr(getattr(torch.ops, lib.namespace), op.name).default
        except (AttributeError, RuntimeError):
            continue  # no torch op of that name (a library without a torch extension)
        torch.library.register_fake(qual, _make_fake(op))
        if qual not in _formulas:
            if lib.backward_of(op.name) is not None:
                register_gradient(qual)
            else:
                _no_gradient(qual)
        _done.add(qual)
    # After the others: they work in torch (and ONNX Runtime) whatever one declaration says.
    error = lib.misdeclared()
    if error is not None:
        raise error
