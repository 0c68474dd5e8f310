// ORT shape inference of a declared op (its output rules, opbridge/op_decl.h) and InferIO, which
// reads the node's attributes and input shapes, symbolic dimensions included.
#include <cstdint>
#include <string>
#include <vector>

#include "declared_op.h"

namespace opbridge::ort {

using detail::failed;

namespace detail {

void infer_declared(const OpSpec& spec, const InferIO& io) {
  const OpDecl& d = *spec.decl;
  const std::string label = std::string(domain()) + "::" + d.onnx_type();
  OpCall call(d);
  const size_t n = io.input_count();
  for (size_t i = 0; i < d.inputs().size() && i < n; ++i) {
    const InferInput in = io.input(i);
    TensorArg& t = call.input(i);
    t.present = in.present;
    t.type = static_cast<ElemType>(in.type);
    t.shape = in.shape;
    // ORT reports an input of unknown rank as rank 0 (see InferInput::shape).
    if (in.present && in.shape.empty() && d.inputs()[i]->rank != 0) t.rank_known = false;
  }
  try {
    for (size_t i = 0; i < d.attrs().size(); ++i) {
      call.attr(i) = onnx_default(*d.attrs()[i]);
      io.read_attr(*d.attrs()[i], &call.attr(i));
    }
  } catch (const Error& e) {
    fail(ORT_INVALID_ARGUMENT, label + ": " + e.what());
  }
  check(check_call(call), label);
  for (size_t o = 0; o < d.outputs().size(); ++o) {
    const OutputDecl& out = d.outputs()[o];
    if (out.like_input >= 0 && d.inputs()[static_cast<size_t>(out.like_input)]->type_var == out.type_var &&
        d.output_shape_function() == nullptr) {
      io.set_output_like_input(o, static_cast<size_t>(out.like_input));
      continue;
    }
    const ElemType type = output_type(call, o);
    if (type == ElemType::kUndefined) continue;
    std::vector<int64_t> dims = output_shape(call, o);
    std::vector<std::string> symbols(dims.size());
    if (d.output_shape_function() != nullptr) {
      // the op's own function: sizes only, no symbols
    } else if (out.like_input >= 0) {
      if (!call.input(static_cast<size_t>(out.like_input)).rank_known) continue;
      symbols = io.input_symbols(static_cast<size_t>(out.like_input));
    } else {
      // A dimension copied from one input dimension keeps its symbol.
      for (size_t k = 0; k < out.dims.size(); ++k) {
        const auto& expr = out.dims[k];
        if (expr.size() == 1 && expr[0].kind == DimTerm::kInputDim) {
          const TensorArg& src = call.input(static_cast<size_t>(expr[0].a));
          if (!src.present || !src.rank_known) continue;
          const auto names = io.input_symbols(static_cast<size_t>(expr[0].a));
          int64_t axis = expr[0].b < 0 ? expr[0].b + src.rank() : expr[0].b;
          if (axis >= 0 && axis < static_cast<int64_t>(names.size())) symbols[k] = names[static_cast<size_t>(axis)];
        }
      }
    }
    io.set_output(o, onnx_elem(type), dims, symbols);
  }
}

}  // namespace detail

namespace {
const OrtOpAttr* node_attr(OrtShapeInferContext* ctx, const char* name) {
  const OrtOpAttr* attr = nullptr;
  if (failed(api().ShapeInferContext_GetAttribute(ctx, name, &attr))) return nullptr;
  return attr;
}

// ReadOpAttr of a list or string: first the size, then the data.
template <class E>
bool read_list(const OrtOpAttr* attr, OrtOpAttrType type, std::vector<E>* out) {
  size_t bytes = 0;
  OrtStatus* st = api().ReadOpAttr(attr, type, nullptr, 0, &bytes);
  if (st != nullptr) api().ReleaseStatus(st);  // "size too small" is expected here
  if (bytes == 0) {
    out->clear();
    // An empty list and a wrong type both report 0 bytes: tell them apart by a read into an
    // empty buffer, which succeeds only for the right type.
    return !failed(api().ReadOpAttr(attr, type, nullptr, 0, &bytes));
  }
  out->resize((bytes + sizeof(E) - 1) / sizeof(E));
  return !failed(api().ReadOpAttr(attr, type, out->data(), out->size() * sizeof(E), &bytes));
}
}  // namespace

bool InferIO::read_attr(const ArgDecl& a, AttrValue* out) const {
  const OrtOpAttr* attr = node_attr(ctx_, a.onnx_name.c_str());
  if (attr == nullptr) return false;
  AttrValue v;
  v.type = a.attr_type;
  size_t written = 0;
  bool ok = false;
  switch (a.attr_type) {
    case AttrType::kInt:
    case AttrType::kBool:
      ok = !failed(api().ReadOpAttr(attr, ORT_OP_ATTR_INT, &v.i, sizeof(v.i), &written));
      break;
    case AttrType::kFloat: {
      float f = 0;
      ok = !failed(api().ReadOpAttr(attr, ORT_OP_ATTR_FLOAT, &f, sizeof(f), &written));
      v.f = f;
      break;
    }
    case AttrType::kString: {
      std::vector<char> chars;
      ok = read_list(attr, ORT_OP_ATTR_STRING, &chars);
      v.s.assign(chars.begin(), chars.end());
      v.s.resize(std::strlen(v.s.c_str()));
      break;
    }
    case AttrType::kInts:
      ok = read_list(attr, ORT_OP_ATTR_INTS, &v.ints);
      break;
    case AttrType::kFloats: {
      std::vector<float> f;
      ok = read_list(attr, ORT_OP_ATTR_FLOATS, &f);
      v.floats.assign(f.begin(), f.end());
      break;
    }
  }
  if (!ok) fail(ORT_INVALID_ARGUMENT, "attribute '" + a.onnx_name + "' must be " + attr_type_name(a.attr_type));
  *out = std::move(v);
  return true;
}

std::vector<std::string> InferIO::input_symbols(size_t index) const {
  OrtTensorTypeAndShapeInfo* info = nullptr;  // context-owned
  if (failed(api().ShapeInferContext_GetInputTypeShape(ctx_, index, &info))) return {};
  size_t rank = 0;
  check(api().GetDimensionsCount(info, &rank));
  std::vector<const char*> names(rank, nullptr);
  check(api().GetSymbolicDimensions(info, names.data(), rank));
  std::vector<std::string> out(rank);
  for (size_t i = 0; i < rank; ++i) out[i] = names[i] != nullptr ? names[i] : "";
  return out;
}

}  // namespace opbridge::ort
