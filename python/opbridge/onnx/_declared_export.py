"""ONNX for declared ops (opbridge/_declarations.py), derived from each declaration:

* OpSchemas, one per op version, with shape inference (the declaration's C++ checks, then its
  output rule), so that onnx.checker and onnx.shape_inference understand our nodes;
* the dynamo translation and the TorchScript symbolic of the custom lowering (one node);
* the op version a node needs, so that an export imports the lowest version that expresses the
  model (an older library then refuses a newer model instead of ignoring an attribute);
* the check for unknown attribute names, which ORT cannot do (it offers no way to list a node's
  attributes): opbridge.InferenceSession, `opbridge check` and onnx.checker (through the OpSchema)
  run it.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, cast

import onnx

from .._declarations import ONNX_TYPE_STRINGS, CheckError, OpDecl, eval_dim

from .._op_library import find_op, libraries
from ._nodes import model_nodes

__all__ = ["attribute_problems", "model_problems", "node_version", "schemas", "stamp_versions", "symbolic",
           "translation"]

_ATTR_TYPES = {
    "int": onnx.defs.OpSchema.AttrType.INT,
    "bool": onnx.defs.OpSchema.AttrType.INT,
    "float": onnx.defs.OpSchema.AttrType.FLOAT,
    "str": onnx.defs.OpSchema.AttrType.STRING,
    "int[]": onnx.defs.OpSchema.AttrType.INTS,
    "float[]": onnx.defs.OpSchema.AttrType.FLOATS,
}


def _onnx_value(a: Any, value: Any) -> Any:
    v = a.normalize(value)
    return int(v) if a.type == "bool" else v


# ---------------------------------------------------------------- schemas and shape inference


# qualname -> what users supplied for ops their declarations cannot describe (public functions in
# opbridge.onnx: register_shape_inference, register_translation, register_symbolic).
_user_infer: dict[str, Callable[..., Any]] = {}
_user_translation: dict[str, Callable[..., Any]] = {}
_user_symbolic: dict[str, Callable[..., Any]] = {}


def register_shape_inference(qualname: str, fn: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """Supplies the ONNX shape inference of a declared op's OpSchema (onnx.shape_inference, the
    checker, exporters' graphs); usable as a decorator. ``fn(ctx)`` gets onnx's InferenceContext
    after the declaration's checks passed and sets the outputs' types
    (``ctx.set_output_type(k, type_proto)``). ORT's own shape inference comes from the C++
    declaration (``OpDecl::output_shape_fn``). Takes effect at once."""
    def register(f: Callable[..., Any]) -> Callable[..., Any]:
        _user_infer[qualname] = f
        return f

    return register(fn) if fn is not None else register


def register_translation(qualname: str, fn: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """Supplies the dynamo exporter's rule (an onnxscript function taking the torch op's arguments)
    for a declared op exported with lowering "custom", instead of the one-node rule the declaration
    gives; usable as a decorator."""
    def register(f: Callable[..., Any]) -> Callable[..., Any]:
        _user_translation[qualname] = f
        return f

    return register(fn) if fn is not None else register


def register_symbolic(qualname: str, fn: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """Supplies the TorchScript exporter's symbolic ``fn(g, *args)`` for a declared op exported with
    lowering "custom"; usable as a decorator."""
    def register(f: Callable[..., Any]) -> Callable[..., Any]:
        _user_symbolic[qualname] = f
        return f

    return register(fn) if fn is not None else register


def _infer(op: OpDecl) -> Callable[[Any], None]:
    def infer(ctx: Any) -> None:
        from onnx.shape_inference import InferenceError

        inputs: list[Any] = []
        types: list[Any] = []
        for k, decl in enumerate(op.inputs):
            t = ctx.get_input_type(k) if k < ctx.get_num_inputs() and ctx.has_input(k) else None
            if t is None or not t.HasField("tensor_type"):
                inputs.append(None)
                types.append(None)
                continue
            tt = t.tensor_type
            dims = None
            if tt.HasField("shape"):
                dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
            inputs.append((tt.elem_type, dims))
            types.append(t)
        attrs = {}
        for a in op.attrs:
            proto = ctx.get_attribute(a.onnx_name)
            if proto is not None:
                attrs[a.name] = onnx.helper.get_attribute_value(proto)
                if isinstance(attrs[a.name], bytes):
                    attrs[a.name] = attrs[a.name].decode()
        try:
            op.check(inputs, attrs)
        except CheckError as e:
            raise InferenceError(f"{op.domain}::{op.onnx_type} ({ctx.get_display_name()}): {e.message}") from None
        user = _user_infer.get(op.qualname)
        if user is not None:
            user(ctx)
            return
        for k, out in enumerate(op.outputs):
            source = next((t for i, t in zip(op.inputs, types) if t is not None and i.type_var == out.type_var), None)
            fixed = op.types[out.type_var][0] if len(op.types[out.type_var]) == 1 else None
            if source is None and fixed is None:
                continue
            result = onnx.TypeProto()
            result.tensor_type.elem_type = source.tensor_type.elem_type if source is not None else cast(int, fixed)
            if out.like >= 0:
                like = types[out.like]
                if like is not None and like.tensor_type.HasField("shape"):
                    result.tensor_type.shape.CopyFrom(like.tensor_type.shape)
            else:
                shape = result.tensor_type.shape
                for d in range(len(out.exprs)):
                    _rule_dim(shape.dim.add(), out, d, types, lambda i: attrs.get(op.attrs[i].name, op.attrs[i].default))
            ctx.set_output_type(k, result)

    return infer


def _input_dim(types: list[Any], index: int, axis: int) -> Any:
    """The dimension proto of input `index` at `axis`, or None where its shape is unknown."""
    t = types[index]
    if t is None or not t.tensor_type.HasField("shape"):
        return None
    dims = t.tensor_type.shape.dim
    return dims[axis] if -len(dims) <= axis < len(dims) else None


def _rule_dim(dim: Any, out: Any, k: int, types: list[Any], attr: Callable[[int], Any]) -> None:
    """Sets `dim` to dimension k of the output rule: a value when the sizes it reads are known, an
    input dimension's symbol where the rule is just that dimension, else nothing (unknown)."""
    single = out.single_input_dim(k)
    if single is not None:
        d = _input_dim(types, *single)
        if d is not None and d.HasField("dim_param"):
            dim.dim_param = d.dim_param
            return

    def size(index: int, axis: int) -> int | None:
        d = _input_dim(types, index, axis)
        return d.dim_value if d is not None and d.HasField("dim_value") else None

    value = eval_dim(out.exprs[k], size, attr)
    if value is not None and value >= 0:
        dim.dim_value = value


def schemas(op: OpDecl) -> list[onnx.defs.OpSchema]:
    """One OpSchema per version of the op (arguments as of that version)."""
    S = onnx.defs.OpSchema
    out = []
    for version in op.versions:
        inputs = [
            S.FormalParameter(i.onnx_name, i.type_var, f"{i.doc} {i.shape}".strip(),
                              param_option=S.FormalParameterOption.Optional if i.optional else S.FormalParameterOption.Single)
            for i in op.inputs if i.since <= version
        ]
        attrs = []
        for a in op.attrs:
            if a.since > version:
                continue
            if a.has_default:
                attrs.append(S.Attribute(a.onnx_name, onnx.helper.make_attribute(a.onnx_name, _onnx_value(a, a.default)),
                                         a.doc))
            else:
                attrs.append(S.Attribute(a.onnx_name, _ATTR_TYPES[a.type], a.doc, required=True))
        outputs = [S.FormalParameter(o.name, o.type_var, o.doc) for o in op.outputs]
        constraints = [(tv, types, f"element types of {tv}") for tv, types in op.type_strings.items()]
        schema = S(op.onnx_type, op.domain, version, doc=op.doc, inputs=inputs, outputs=outputs,
                   type_constraints=constraints, attributes=attrs)
        schema.set_type_and_shape_inference_function(_infer(op))
        out.append(schema)
    return out


def infer_function(op: OpDecl) -> Callable[[Any], None]:
    return _infer(op)


def register_schemas(ops: Iterable[OpDecl]) -> None:
    for op in ops:
        for schema in schemas(op):
            if not onnx.defs.has(schema.name, schema.since_version, schema.domain):
                onnx.defs.register_schema(schema)


# ---------------------------------------------------------------- versions and attributes


def node_version(op: OpDecl, node: onnx.NodeProto) -> int:
    """The op version `node` needs."""
    present = [op.inputs[k].onnx_name for k, name in enumerate(node.input) if name and k < len(op.inputs)]
    attrs = {}
    for a in node.attribute:
        value = onnx.helper.get_attribute_value(a)
        attrs[a.name] = value.decode() if isinstance(value, bytes) else value
    return op.required_version(present, attrs)


def stamp_versions(proto: onnx.ModelProto, requested: dict[str, int], nodes: Iterable[onnx.NodeProto]) -> None:
    """Imports each declared domain the model uses at the lowest version that expresses its
    nodes, or at the version the caller requested (an error where that is too old)."""
    need: dict[str, tuple[int, str]] = {}
    for node in nodes:
        op = find_op(node.domain, node.op_type)
        if op is None:
            continue
        v = node_version(op, node)
        if v > need.get(node.domain, (0, ""))[0]:
            need[node.domain] = (v, f"{node.op_type} node {node.name!r}")
    for domain in need:
        if all(imp.domain != domain for imp in proto.opset_import):
            proto.opset_import.append(onnx.helper.make_opsetid(domain, need[domain][0]))
    for imp in proto.opset_import:
        if imp.domain not in need:
            continue
        version, why = need[imp.domain]
        want = requested.get(imp.domain)
        if want is not None and int(want) < version:
            raise ValueError(f"custom_opsets asks for {imp.domain} version {want}, but the {why} needs version "
                             f"{version} (the op, or an argument it uses, is newer than version {want})")
        imp.version = int(want) if want is not None else version


def misdeclared_ops(model: onnx.ModelProto) -> Exception | None:
    """The MisdeclaredOpError for the ops of the model's nodes that their library refuses (their
    declaration is bad: ONNX Runtime would fail at session creation), or None."""
    used: dict[str, set[str]] = {}
    for node in model_nodes(model):
        used.setdefault(node.domain, set()).add(node.op_type)
    for lib in libraries():
        error = lib.misdeclared(used[lib.domain]) if lib.refused and lib.domain in used else None
        if error is not None:
            return error
    return None


def attribute_problems(model: onnx.ModelProto) -> list[str]:
    """Nodes of declared ops with attributes their op does not have (e.g. a misspelled
    ``epsilion``), or that need a newer op version than the model imports. ORT cannot see these:
    it reads attributes by name and ignores the rest."""
    imports = {i.domain: i.version for i in model.opset_import}
    problems = []
    libs = {lib.domain: lib for lib in libraries()}
    for node in model_nodes(model):
        if node.domain not in libs:
            continue
        op = find_op(node.domain, node.op_type)
        label = _label(node)
        if op is None and libs[node.domain].misdeclared([node.op_type]) is not None:
            continue  # no attributes to compare: misdeclared_ops reports it
        if op is None:
            problems.append(f"{label}: the library of domain {node.domain!r} has no op {node.op_type!r}")
            continue
        names = {a.onnx_name for a in op.attrs}
        for a in node.attribute:
            if a.name not in names:
                problems.append(f"{label}: unknown attribute {a.name!r}; {op.onnx_type} has "
                                f"{', '.join(sorted(names)) or 'no attributes'}")
        if _loadable_attributes(op, node) is None:
            continue  # a required attribute missing or one of another type: ORT refuses the node at load
        version = imports.get(node.domain)
        need = node_version(op, node)
        if version is not None and need > version:
            problems.append(f"{label}: needs {node.domain} version {need} (it sets an argument added then), "
                            f"but the model imports version {version}")
        if version is not None and version > op.library.domain_version:
            problems.append(f"{label}: the model imports {node.domain} version {version}, newer than this "
                            f"library's {op.library.domain_version}: upgrade the library")
    return problems


# ---------------------------------------------------------------- the custom lowering


def _split(op: OpDecl, bound: inspect.BoundArguments) -> tuple[list[Any], dict[str, Any]]:
    inputs, attrs = [], {}
    for a in op.args:
        value = bound.arguments[a.name]
        if hasattr(a, "optional"):
            inputs.append(value)
        elif value is not None and (a.since == op.since or not a.is_default(value)):
            # Arguments of the op's first version are always written; later ones only when they
            # differ from their default, so the node stays valid at the oldest version it can.
            attrs[a.onnx_name] = _onnx_value(a, value)
    return inputs, attrs


def translation(op: OpDecl) -> Callable[..., Any]:
    """The dynamo exporter's translation of the torch op into one ``domain::OnnxType`` node."""
    import onnxscript

    sig = op.signature()
    # One onnxscript op per version: onnxscript writes every attribute its schema has a default
    # for, so a node must be made with the schema of the version it needs.
    nodes = {schema.since_version: onnxscript.values.Op(onnxscript.values.Opset(op.domain, schema.since_version),
                                                        op.onnx_type, schema)
             for schema in schemas(op)}

    def translate(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        inputs, attrs = _split(op, bound)
        present = [d.onnx_name for d, v in zip(op.inputs, inputs) if v is not None]
        version = op.required_version(present, attrs)
        while inputs and inputs[-1] is None:  # trailing omitted inputs are simply absent
            inputs.pop()
        return nodes[max(v for v in nodes if v <= version)](*inputs, **attrs)

    translate.__name__ = translate.__qualname__ = op.qualname.replace("::", "_")
    translate.__signature__ = sig  # type: ignore[attr-defined]
    return translate


def _cast_to_type_var(g: Any, op: OpDecl, decl: Any, value: Any, wanted: dict[Any, Any]) -> Any:
    """The TorchScript exporter's types may differ from those torch ran with (it types
    ``float32 / int64`` arithmetic as float64, e.g. Deformable DETR's sampling locations): inputs of
    one type variable are cast to the type of the first (or to the variable's only type)."""
    from ._build import _jit_scalar_type

    jit = _jit_scalar_type()
    try:
        have = jit.from_value(value)
    except Exception:  # noqa: BLE001 - an untyped value: leave it
        return value
    types = op.types[decl.type_var]
    want = wanted.setdefault(decl.type_var, jit.from_onnx_type(types[0]) if len(types) == 1 else have)
    if have == want:
        return value
    return g.op("Cast", value, to_i=int(want.onnx_type()))


_TS_DESC = {"int": "i", "bool": "b", "float": "f", "str": "s", "int[]": "is", "float[]": "fs"}
_TS_SUFFIX = {"int": "i", "bool": "i", "float": "f", "str": "s", "int[]": "i", "float[]": "f"}


def symbolic(op: OpDecl) -> Callable[..., Any]:
    """The TorchScript exporter's symbolic: one ``domain::OnnxType`` node."""
    from torch.onnx import symbolic_helper as sh

    sig = op.signature()

    def sym(g: Any, *args: Any) -> Any:
        bound = sig.bind(*args)
        bound.apply_defaults()
        inputs, attrs, attr_values = [], {}, {}
        wanted: dict[str, Any] = {}  # type variable -> the scalar type its inputs get
        for a in op.args:
            value = bound.arguments.get(a.name)
            if hasattr(a, "optional"):
                if value is None or sh._is_none(value):
                    inputs.append(sh._optional_input_placeholder_tensor(g))
                    continue
                inputs.append(_cast_to_type_var(g, op, a, value, wanted))
            elif value is not None and not (hasattr(value, "node") and sh._is_none(value)):
                v = sh._get_const(value, _TS_DESC[a.type], a.name) if hasattr(value, "node") else value
                attr_values[a.name] = v
                if a.since == op.since or not a.is_default(v):
                    attrs[f"{a.onnx_name}_{_TS_SUFFIX[a.type]}"] = _onnx_value(a, v)
        outs = g.op(f"{op.domain}::{op.onnx_type}", *inputs, outputs=len(op.outputs), **attrs)
        outs_t = outs if len(op.outputs) > 1 else (outs,)
        for o, out in zip(outs_t, op.outputs):
            if out.like >= 0:
                like_type = inputs[out.like].type()
                if op.inputs[out.like].type_var != out.type_var:  # the shape of one input, another type
                    from ._build import _jit_scalar_type

                    source = next((v for d, v in zip(op.inputs, inputs) if d.type_var == out.type_var), None)
                    dtype = (source.type().dtype() if source is not None else
                             _jit_scalar_type().from_onnx_type(op.types[out.type_var][0]).dtype())
                    like_type = like_type.with_dtype(dtype)
                o.setType(like_type)
            else:
                source = next((v for d, v in zip(op.inputs, inputs) if d.type_var == out.type_var), None)
                sizes = out.sizes(lambda index, axis: sh._get_tensor_dim_size(inputs[index], axis),
                                  lambda i: attr_values.get(op.attrs[i].name, op.attrs[i].default))
                try:
                    if source is None:  # a type variable of one type, bound by no input
                        from ._build import _jit_scalar_type

                        dtype = _jit_scalar_type().from_onnx_type(op.types[out.type_var][0]).dtype()
                        o.setType(inputs[0].type().with_dtype(dtype).with_sizes(sizes))
                    else:
                        o.setType(source.type().with_sizes(sizes))
                except RuntimeError:
                    pass
        return outs

    return sym


def model_problems(model: onnx.ModelProto) -> list[str]:
    """What is wrong with the model's nodes of declared ops, as far as it shows before a run: the
    nodes ``attribute_problems`` and ``node_problems`` name, or else those whose static shapes
    already fail their op's checks (``static_shape_problems``). One line per problem, each naming
    the op, the node, the input or attribute and what was expected. Empty when there are none."""
    problems = attribute_problems(model)
    types = _static_types(model)
    problems += node_problems(model, types)
    return problems or static_shape_problems(model, types)


def _static_types(model: onnx.ModelProto) -> dict[str, tuple[Any, ...]]:
    """Value name -> (element type, dims with -1 where unknown, or None) for the main graph's
    values whose type ONNX's shape inference knows; empty where the graph has no declared-op node."""
    known = {lib.domain for lib in libraries()}
    if not any(n.domain in known for n in model.graph.node):
        return {}
    # Inference on the graph without its weights' data (initializers as typed inputs): the memory
    # a multi-GB model's copy would take is not spent.
    light = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import, functions=model.functions)
    src = model.graph
    light.graph.node.extend(src.node)
    light.graph.input.extend(src.input)
    light.graph.output.extend(src.output)
    light.graph.value_info.extend(src.value_info)
    named = {i.name for i in src.input}
    light.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in src.initializer if t.name not in named)
    try:
        g = onnx.shape_inference.infer_shapes(light, strict_mode=False).graph
    except Exception:  # noqa: BLE001 - e.g. a declared op's inference refusing: the shapes the model states
        g = light.graph
    types: dict[str, tuple[Any, ...]] = {}
    for v in (*g.input, *g.value_info, *g.output):
        tt = v.type.tensor_type
        if v.type.HasField("tensor_type") and tt.elem_type:
            dims = ([d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
                    if tt.HasField("shape") else None)
            types[v.name] = (tt.elem_type, dims)
    return types


def _label(node: onnx.NodeProto) -> str:
    """The op and the node as ONNX Runtime's messages name them: an unnamed node by its op only."""
    return f"{node.domain}::{node.op_type}" + (f" (node {node.name!r})" if node.name else "")


def node_problems(model: onnx.ModelProto, types: dict[str, tuple[Any, ...]] | None = None) -> list[str]:
    """Nodes of declared ops (in the main graph) that ONNX Runtime would refuse at load or run in
    its own words: more inputs than the op has, a required input or attribute missing, an attribute
    of another type, an input of an element type the op does not take (``types``: as
    ``_static_types`` gives them)."""
    types = _static_types(model) if types is None else types
    problems = []
    for node in model.graph.node:
        op = find_op(node.domain, node.op_type)
        if op is None:
            continue  # not a declared op, or one attribute_problems names
        label = _label(node)
        names = ", ".join(repr(i.onnx_name) for i in op.inputs)
        required = sum(not i.optional for i in op.inputs)
        if len(node.input) > len(op.inputs):
            takes = f"{required} to {len(op.inputs)}" if required < len(op.inputs) else f"{len(op.inputs)}"
            problems.append(f"{label}: has {len(node.input)} inputs; {op.onnx_type} takes {takes} ({names})")
            continue
        for k, decl in enumerate(op.inputs):
            if not decl.optional and (k >= len(node.input) or not node.input[k]):
                problems.append(f"{label}: input {k + 1} ({decl.onnx_name!r}) is missing; {op.onnx_type} requires it")
        given = {a.name: a for a in node.attribute}
        for a in op.attrs:
            proto = given.get(a.onnx_name)
            want = _PROTO_ATTR_TYPES.get(a.type)
            # In the ORT library's words (cpp/ort/declared_kernel.cpp), which refuses the node alike.
            if proto is None and a.required:
                problems.append(f"{label}: required {_ATTR_KINDS.get(a.type, a.type)} attribute {a.onnx_name!r} "
                                "is missing")
            elif proto is not None and want is not None and proto.type != want:
                expected = "an int (0 or 1)" if a.type == "bool" else _ATTR_NAMES.get(want, a.type)
                problems.append(f"{label}: attribute {a.onnx_name!r} must be {expected}, got "
                                f"{_ATTR_NAMES.get(proto.type, onnx.AttributeProto.AttributeType.Name(proto.type))}")
        bound: dict[str, tuple[str, int]] = {}
        for k, decl in enumerate(op.inputs):
            t = types.get(node.input[k]) if k < len(node.input) and node.input[k] else None
            if t is None:
                continue
            allowed = op.types.get(decl.type_var, ())
            if t[0] not in allowed:
                problems.append(f"{label}: input {decl.onnx_name!r} (value {node.input[k]!r}) is "
                                f"{_type_string(t[0])}; {op.onnx_type} takes "
                                f"{', '.join(_type_string(x) for x in allowed)}")
                continue
            first = bound.setdefault(decl.type_var, (decl.onnx_name, t[0]))
            if first[1] != t[0]:
                problems.append(f"{label}: input {decl.onnx_name!r} is {_type_string(t[0])} but {first[0]!r} is "
                                f"{_type_string(first[1])}; {op.onnx_type} takes them of one type")
    return problems


_ATTR_KINDS = {"int": "int", "float": "float", "str": "string", "bool": "bool", "int[]": "ints", "float[]": "floats"}
_ATTR_NAMES = {onnx.AttributeProto.INT: "an int", onnx.AttributeProto.FLOAT: "a float",
               onnx.AttributeProto.STRING: "a string", onnx.AttributeProto.INTS: "a list of ints",
               onnx.AttributeProto.FLOATS: "a list of floats"}


def _type_string(elem_type: int) -> str:
    return ONNX_TYPE_STRINGS.get(elem_type, f"element type {elem_type}")


def static_shape_problems(model: onnx.ModelProto, types: dict[str, tuple[Any, ...]] | None = None) -> list[str]:
    """Nodes of declared ops (in the main graph) whose inputs' static shapes and types, as ONNX's
    shape inference knows them (``types``: as ``_static_types`` gives them), already fail the op's
    checks: the op's own message per node, so a model that could only fail at run is refused at load."""
    types = _static_types(model) if types is None else types
    problems = []
    for node in model.graph.node:
        op = find_op(node.domain, node.op_type)
        if op is None:
            continue
        inputs = [types.get(node.input[k]) if k < len(node.input) and node.input[k] else None
                  for k in range(len(op.inputs))]
        if any(t is None for t, name in zip(inputs, node.input) if name):
            continue  # an input of unknown type: nothing to judge
        attrs = _loadable_attributes(op, node)
        if attrs is None or not _loadable_types(op, inputs):
            continue  # ORT refuses the node at load (node_problems names why)
        try:
            op.check(inputs, attrs)
        except CheckError as e:
            problems.append(f"static shapes already fail the checks of {_label(node)}: {e.message}")
    return problems


_PROTO_ATTR_TYPES = {"int": onnx.AttributeProto.INT, "bool": onnx.AttributeProto.INT, "float": onnx.AttributeProto.FLOAT,
               "str": onnx.AttributeProto.STRING, "int[]": onnx.AttributeProto.INTS,
               "float[]": onnx.AttributeProto.FLOATS}


def _loadable_attributes(op: OpDecl, node: onnx.NodeProto) -> dict[Any, Any] | None:
    """The node's attributes by torch name, or None where ORT itself refuses them when the session
    is created (a required one missing, one of another type)."""
    given = {a.name: a for a in node.attribute}
    attrs = {}
    for a in op.attrs:
        proto = given.get(a.onnx_name)
        if proto is None:
            if a.required:
                return None
            continue
        if proto.type != _PROTO_ATTR_TYPES.get(a.type, proto.type):
            return None
        value = onnx.helper.get_attribute_value(proto)
        attrs[a.name] = value.decode() if isinstance(value, bytes) else value
    return attrs


def _loadable_types(op: OpDecl, inputs: list[Any]) -> bool:
    """Whether ORT has a kernel for these input element types (each allowed by its type variable,
    one type per variable); otherwise ORT refuses the node when the session is created."""
    bound: dict[str, int] = {}
    for decl, t in zip(op.inputs, inputs):
        if t is None:
            continue
        if t[0] not in op.types.get(decl.type_var, ()) or bound.setdefault(decl.type_var, t[0]) != t[0]:
            return False
    return True
