"""onnx's shape inference over an onnx_ir model, in memory bounded by the graph, not its tensors.

The fusion rules check the types and static shapes of the values around a GroupNorm, which some
exporters do not record (the TorchScript exporter; models from other tools): onnx's inference
fills them in, with data propagation, which follows integer shape computations
(Shape -> Gather -> Concat -> Reshape) so that the Reshapes they feed get static shapes.

That data propagation has a cost proportional to values, not to the graph: every rank-1 value of
n statically known elements that reaches an op with a data propagator (Slice, Gather, Cast,
Concat, Unsqueeze, Add, ...) is represented as n shape dimensions of about 70 bytes each, whatever
its type. A 0.5 GB float32 parameter of which a model uses ``p[:4]`` cost 9 GB there. So inference
here runs twice on a copy of the graph that holds no tensor over INFERENCE_TENSOR_BYTES (larger
initializers and Constant nodes become graph inputs of their type and shape):

1. without data propagation: the ranks and sizes that declarations and shapes alone give;
2. with data propagation, where the readers of a rank-1 value that cannot be shape data read an
   input of the same type with its size hidden (a symbolic dim) instead: the largest rank-1 values
   of known size past DATA_PROPAGATION_ELEMENTS in all, and every rank-1 (or unknown-rank) value of
   unknown size that is not computed from shapes (from Shape, Size and small constants through
   ops whose result is no larger than their inputs), whose size only data propagation could find.

Its results are merged into the model; a hidden size never replaces a known one.
"""

from __future__ import annotations

from typing import Any, Iterator, cast

import onnx

from ._nodes import graphs

# Tensors up to this size are in the copy onnx's inference sees (shape constants are a few
# integers); larger ones are represented by their type and shape only. onnx_ir's own inference
# pass uses the same limit for the main graph's initializers.
INFERENCE_TENSOR_BYTES = 1024
# Elements of all the rank-1 values of known size that data propagation may represent (about
# 70 bytes each in onnx's bookkeeping, so at most about 70 MB); past it the largest are hidden.
DATA_PROPAGATION_ELEMENTS = 1 << 20
# Ops whose rank-1 integer result is no larger than their inputs: a value computed by them from
# Shape, Size and small constants is shape data, small by construction. Size-making ops
# (ConstantOfShape, Expand, Tile, Range, Resize, Pad, OneHot) are not among them.
_SHAPE_PRESERVING_OPS = frozenset({
    "Abs", "Add", "And", "Cast", "CastLike", "Ceil", "Clip", "Concat", "Div", "Equal", "Floor", "Flatten", "Gather",
    "GatherElements", "Greater", "GreaterOrEqual", "Identity", "Less", "LessOrEqual", "Max", "Min", "Mod", "Mul",
    "Neg", "Not", "Or", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSum", "Reshape", "Round", "Shape", "Sign",
    "Size", "Slice", "Split", "Squeeze", "Sub", "Sum", "Unsqueeze", "Where", "Xor",
})
_INTEGER_TYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32})
_PLACEHOLDER_LOCATION = "opbridge-shape-inference-placeholder"
_HIDDEN = "opbridge_hidden_size"


def _ir() -> Any:
    import onnx_ir as ir

    return ir


# --------------------------------------------------------------------------------------------
# The copy onnx sees: the graph without its large tensors
# --------------------------------------------------------------------------------------------


def _large(tensor: Any) -> bool:
    ir = _ir()
    return isinstance(tensor, ir.ExternalTensor) or int(tensor.nbytes) > INFERENCE_TENSOR_BYTES


def _placeholder(tensor: Any) -> Any:
    """A tensor of ``tensor``'s type and shape that serializes as an external reference: no byte
    of ``tensor`` is read or copied."""
    ir = _ir()
    return ir.ExternalTensor(_PLACEHOLDER_LOCATION, None, None, tensor.dtype, shape=tensor.shape,
                             name=tensor.name or "")


def _all_graphs(model: Any) -> Iterator[Any]:
    """The main graph, its subgraphs and the graphs of model-local functions."""
    yield from model.graphs()
    for fn in model.functions.values():
        yield fn.graph
        yield from fn.subgraphs()


def _graph_copy(model: Any) -> onnx.ModelProto:
    """The model serialized with every tensor over INFERENCE_TENSOR_BYTES (initializers and Constant
    values, in every graph) replaced by a placeholder while serializing; the model is unchanged."""
    ir = _ir()
    swapped: list[tuple[Any, Any]] = []  # (value, tensor) and (node, attribute)
    attributes: list[tuple[Any, str, Any]] = []
    try:
        for graph in _all_graphs(model):
            for value in graph.initializers.values():
                t = value.const_value
                if t is not None and _large(t):
                    swapped.append((value, t))
                    value.const_value = _placeholder(t)
            for node in graph:
                if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                    attr = node.attributes.get("value")
                    if attr is not None and attr.type == ir.AttributeType.TENSOR and _large(attr.value):
                        attributes.append((node, "value", attr))
                        node.attributes["value"] = ir.AttrTensor("value", _placeholder(attr.value))
        return cast(onnx.ModelProto, ir.serde.serialize_model(model))
    finally:
        for value, t in swapped:
            value.const_value = t
        for node, key, attr in attributes:
            node.attributes[key] = attr


def _tensor_type(t: onnx.TensorProto) -> onnx.TypeProto:
    return onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims))


def _lift_placeholders(proto: onnx.ModelProto) -> None:
    """Placeholders become inputs of the main graph of their type and shape (a subgraph reads them
    from the outer scope), so that onnx reads no tensor and parses no external data."""
    main = proto.graph
    declared = {vi.name for vi in main.input}
    for graph in graphs(main):
        inputs = {vi.name for vi in graph.input}
        keep = [t for t in graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
        for t in graph.initializer:
            if t.data_location == onnx.TensorProto.EXTERNAL and t.name not in inputs and t.name not in declared:
                main.input.append(onnx.helper.make_value_info(t.name, _tensor_type(t)))
                declared.add(t.name)
        if len(keep) != len(graph.initializer):
            del graph.initializer[:]
            graph.initializer.extend(keep)
        nodes = []
        for node in graph.node:
            value = next((a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR),
                         None)
            if (node.op_type == "Constant" and node.domain in ("", "ai.onnx") and value is not None
                    and value.data_location == onnx.TensorProto.EXTERNAL and len(node.output) == 1):
                if node.output[0] not in declared:
                    main.input.append(onnx.helper.make_value_info(node.output[0], _tensor_type(value)))
                    declared.add(node.output[0])
                continue
            nodes.append(node)
        if len(nodes) != len(graph.node):
            del graph.node[:]
            graph.node.extend(nodes)
    for fn in proto.functions:
        fn_nodes = [n for n in fn.node if not (
            n.op_type == "Constant" and any(a.type == onnx.AttributeProto.TENSOR
                                            and a.t.data_location == onnx.TensorProto.EXTERNAL for a in n.attribute))]
        if len(fn_nodes) != len(fn.node):
            # A function's large constant cannot be lifted out of it: its readers stay untyped.
            del fn.node[:]
            fn.node.extend(fn_nodes)


# --------------------------------------------------------------------------------------------
# What data propagation must not see
# --------------------------------------------------------------------------------------------


def _types(proto: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    out: dict[str, onnx.TypeProto] = {}
    for graph in graphs(proto.graph):
        for vi in (*graph.input, *graph.value_info, *graph.output):
            if vi.type.HasField("tensor_type"):
                out.setdefault(vi.name, vi.type)
        for t in graph.initializer:
            out.setdefault(t.name, _tensor_type(t))
    return out


def _rank_one_size(t: onnx.TypeProto | None) -> tuple[bool, int | None]:
    """(may be rank 1, its static size or None)."""
    if t is None or not t.tensor_type.HasField("shape"):
        return True, None
    dims = t.tensor_type.shape.dim
    if len(dims) != 1:
        return False, None
    return True, dims[0].dim_value if dims[0].HasField("dim_value") else None


def _shape_data(proto: onnx.ModelProto) -> set[str]:
    """Names of values computed from shapes: Shape and Size outputs, small integer constants, and
    what _SHAPE_PRESERVING_OPS make of them alone."""
    shape_like: set[str] = set()
    for graph in graphs(proto.graph):
        for t in graph.initializer:
            if t.data_type in _INTEGER_TYPES:
                shape_like.add(t.name)
    changed = True
    while changed:  # graphs are topologically sorted; the loop covers subgraphs read from outside
        changed = False
        for graph in graphs(proto.graph):
            for node in graph.node:
                if node.domain not in ("", "ai.onnx") or all(o in shape_like for o in node.output if o):
                    continue
                if node.op_type in ("Shape", "Size"):
                    ok = True
                elif node.op_type == "Constant":
                    ok = any(a.type == onnx.AttributeProto.TENSOR and a.t.data_type in _INTEGER_TYPES
                             or a.type == onnx.AttributeProto.INTS or a.type == onnx.AttributeProto.INT
                             for a in node.attribute)
                elif node.op_type in _SHAPE_PRESERVING_OPS:
                    ok = all(not i or i in shape_like for i in node.input)
                else:
                    ok = False
                if ok:
                    shape_like.update(o for o in node.output if o)
                    changed = True
    return shape_like


def _hide(proto: onnx.ModelProto, inferred: onnx.ModelProto) -> set[str]:
    """Changes ``proto`` so that data propagation sees no value of ``_hide``'s kinds (module
    docstring); returns the names whose size was hidden."""
    types = _types(inferred)
    shape_like = _shape_data(inferred)
    inputs = {vi.name: vi for vi in proto.graph.input}
    produced: set[str] = set()
    for graph in graphs(proto.graph):
        for node in graph.node:
            produced.update(o for o in node.output if o)
    known: list[tuple[int, str]] = []
    hidden: set[str] = set()
    for name in (*inputs, *produced):
        maybe_rank_one, size = _rank_one_size(types.get(name))
        if not maybe_rank_one:
            continue
        if size is not None:
            known.append((size, name))
        elif name in produced and name not in shape_like:
            hidden.add(name)
    total = sum(n for n, _ in known)
    for size, name in sorted(known, reverse=True):
        if total <= DATA_PROPAGATION_ELEMENTS:
            break
        hidden.add(name)
        total -= size
    renamed = {}
    for k, name in enumerate(sorted(hidden)):
        t = onnx.TypeProto()
        source = types.get(name)
        if source is not None:
            t.CopyFrom(source)
        if name in inputs:
            target = inputs[name].type
        else:
            renamed[name] = f"{name}.{_HIDDEN}"
            vi = proto.graph.input.add()
            vi.name = renamed[name]
            target = vi.type
            target.CopyFrom(t)
            if not target.HasField("tensor_type"):
                target.tensor_type.elem_type = onnx.TensorProto.FLOAT
        if target.tensor_type.HasField("shape") and len(target.tensor_type.shape.dim) == 1:
            dim = target.tensor_type.shape.dim[0]
            dim.Clear()
            dim.dim_param = f"{_HIDDEN}_{k}"  # one symbol each: onnx equates equal symbols
    if renamed:
        for graph in graphs(proto.graph):
            for node in graph.node:
                for i, name in enumerate(node.input):
                    if name in renamed:
                        node.input[i] = renamed[name]
    return hidden


# --------------------------------------------------------------------------------------------
# Inference and merge
# --------------------------------------------------------------------------------------------


def _infer(proto: onnx.ModelProto, data_prop: bool) -> onnx.ModelProto | None:
    try:
        return onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=data_prop)
    except Exception:  # onnx raises several types for models it cannot infer; keep what the model has
        return None


def _merge(model: Any, inferred: onnx.ModelProto) -> None:
    """Inferred types and shapes into the model's values (initializers keep their tensors'), with
    hidden sizes never replacing what the value had."""
    ir = _ir()
    types = _types(inferred)
    for graph in model.graphs():
        for value in ir.convenience.create_value_mapping(graph).values():
            if value.const_value is not None or value.name not in types:
                continue
            t = types[value.name].tensor_type
            if t.elem_type and value.dtype is None:
                value.dtype = ir.DataType(t.elem_type)
            if not t.HasField("shape"):
                continue
            dims: list[Any] = []
            old = list(value.shape.dims) if value.shape is not None else None
            for i, d in enumerate(t.shape.dim):
                if d.HasField("dim_value"):
                    dims.append(int(d.dim_value))
                elif d.dim_param and not d.dim_param.startswith(_HIDDEN):
                    dims.append(d.dim_param)
                else:
                    dims.append(old[i] if old is not None and len(old) == len(t.shape.dim) else None)
            shape = ir.Shape(dims)
            if value.shape is None or value.shape != shape:
                if value.shape is not None and len(value.shape) == len(shape) and any(
                        d is None for d in dims):
                    # Keep what was known where the inference knows nothing.
                    shape = ir.Shape([o if n is None else n for o, n in zip(value.shape.dims, dims)])
                value.shape = shape


def infer_shapes_ir(model: Any) -> None:
    """Types and shapes of ``model``'s (an onnx_ir Model) values from onnx's inference with data
    propagation, reading no tensor over INFERENCE_TENSOR_BYTES (module docstring). Best effort: a
    model onnx cannot infer keeps what it has."""
    from ._script import register_schemas

    register_schemas()
    proto = _graph_copy(model)
    _lift_placeholders(proto)
    first = _infer(proto, data_prop=False)
    if first is None:
        return
    _hide(proto, first)
    second = _infer(proto, data_prop=True)
    _merge(model, second if second is not None else first)
