// Building an op declaration (OpDecl's chained calls) and reading it back; the names of element and
// attribute types; a call's tensor arguments.
#include "opbridge/op_decl.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace opbridge {

const char* elem_type_name(ElemType t) {
  switch (t) {
    case ElemType::kFloat32: return "float32";
    case ElemType::kFloat64: return "float64";
    case ElemType::kFloat16: return "float16";
    case ElemType::kBFloat16: return "bfloat16";
    case ElemType::kUint8: return "uint8";
    case ElemType::kInt8: return "int8";
    case ElemType::kInt32: return "int32";
    case ElemType::kInt64: return "int64";
    case ElemType::kBool: return "bool";
    case ElemType::kUint16: return "uint16";
    case ElemType::kInt16: return "int16";
    case ElemType::kUint32: return "uint32";
    case ElemType::kUint64: return "uint64";
    case ElemType::kComplex64: return "complex64";
    case ElemType::kComplex128: return "complex128";
    case ElemType::kUndefined: break;
  }
  return "undefined";
}

const char* attr_type_name(AttrType t) {
  switch (t) {
    case AttrType::kInt: return "an int";
    case AttrType::kFloat: return "a float";
    case AttrType::kString: return "a string";
    case AttrType::kBool: return "a bool";
    case AttrType::kInts: return "a list of ints";
    case AttrType::kFloats: return "a list of floats";
  }
  return "an attribute";
}

// ---------------------------------------------------------------- TensorArg

int64_t TensorArg::dim(int64_t i) const {
  const int64_t r = rank();
  if (!rank_known) return -1;
  if (i < 0) i += r;
  if (i < 0 || i >= r) return -1;
  return shape[static_cast<size_t>(i)] < 0 ? -1 : shape[static_cast<size_t>(i)];
}

bool TensorArg::all_known() const {
  if (!rank_known) return false;
  for (int64_t d : shape) {
    if (d < 0) return false;
  }
  return true;
}

int64_t TensorArg::numel() const {
  if (!all_known()) return -1;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d == 0) return 0;
  }
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return -1;
  }
  return n;
}

// ---------------------------------------------------------------- OpDecl building

OpDecl::OpDecl(std::string name, std::string onnx_type, int since)
    : name_(std::move(name)), onnx_type_(std::move(onnx_type)), since_(since) {}

OpDecl& OpDecl::doc(std::string text) {
  // Before any argument: the op's description; after one: that argument's.
  if (args_.empty()) {
    doc_ = std::move(text);
  } else {
    last("doc").doc = std::move(text);
  }
  return *this;
}

ArgDecl& OpDecl::add(ArgDecl a) {
  derived_.finished = false;
  if (a.onnx_name.empty()) a.onnx_name = a.name;
  args_.push_back(std::move(a));
  return args_.back();
}

ArgDecl& OpDecl::last(const char* what) {
  if (args_.empty()) {
    build_errors_.push_back(std::string(what) + "() before any argument was declared");
    static ArgDecl dummy;
    dummy = ArgDecl{};
    return dummy;
  }
  derived_.finished = false;
  return args_.back();
}

OpDecl& OpDecl::input(std::string name, std::string type_var, std::string doc) {
  ArgDecl a;
  a.is_input = true;
  a.name = std::move(name);
  a.type_var = std::move(type_var);
  a.doc = std::move(doc);
  add(std::move(a));
  return *this;
}

namespace {
ArgDecl attribute(std::string name, AttrType type, std::string doc, bool has_default) {
  ArgDecl a;
  a.is_input = false;
  a.name = std::move(name);
  a.attr_type = type;
  a.doc = std::move(doc);
  a.has_default = has_default;
  a.default_value.type = type;
  return a;
}
}  // namespace

OpDecl& OpDecl::attr_int(std::string name, std::string doc) {
  add(attribute(std::move(name), AttrType::kInt, std::move(doc), false));
  return *this;
}
OpDecl& OpDecl::attr_int(std::string name, int64_t value, std::string doc) {
  add(attribute(std::move(name), AttrType::kInt, std::move(doc), true)).default_value.i = value;
  return *this;
}
OpDecl& OpDecl::attr_float(std::string name, double value, std::string doc) {
  add(attribute(std::move(name), AttrType::kFloat, std::move(doc), true)).default_value.f = value;
  return *this;
}
OpDecl& OpDecl::attr_float(std::string name, std::string doc) {
  add(attribute(std::move(name), AttrType::kFloat, std::move(doc), false));
  return *this;
}
OpDecl& OpDecl::attr_bool(std::string name, bool value, std::string doc) {
  add(attribute(std::move(name), AttrType::kBool, std::move(doc), true)).default_value.i = value ? 1 : 0;
  return *this;
}
OpDecl& OpDecl::attr_string(std::string name, std::string value, std::string doc) {
  add(attribute(std::move(name), AttrType::kString, std::move(doc), true)).default_value.s = std::move(value);
  return *this;
}
OpDecl& OpDecl::attr_ints(std::string name, std::vector<int64_t> value, std::string doc) {
  add(attribute(std::move(name), AttrType::kInts, std::move(doc), true)).default_value.ints = std::move(value);
  return *this;
}
OpDecl& OpDecl::attr_floats(std::string name, std::vector<double> value, std::string doc) {
  add(attribute(std::move(name), AttrType::kFloats, std::move(doc), true)).default_value.floats = std::move(value);
  return *this;
}

OpDecl& OpDecl::optional() {
  ArgDecl& a = last("optional");
  if (!a.is_input) build_errors_.push_back("argument " + a.name + ": optional() applies to inputs; give an attribute a default");
  a.optional = true;
  return *this;
}
OpDecl& OpDecl::required() {
  ArgDecl& a = last("required");
  if (a.is_input) build_errors_.push_back("argument " + a.name + ": required() applies to attributes (inputs are required unless optional())");
  a.required = true;
  a.has_default = false;
  return *this;
}
OpDecl& OpDecl::onnx_name(std::string n) {
  last("onnx_name").onnx_name = std::move(n);
  return *this;
}
OpDecl& OpDecl::shape(std::string s) {
  last("shape").shape_doc = std::move(s);
  return *this;
}
OpDecl& OpDecl::rank(int64_t r) {
  last("rank").rank = r;
  return *this;
}
OpDecl& OpDecl::min_rank(int64_t r) {
  last("min_rank").min_rank = r;
  return *this;
}
OpDecl& OpDecl::host_memory() {
  last("host_memory").host_memory = true;
  return *this;
}
OpDecl& OpDecl::choices(std::vector<std::string> values) {
  ArgDecl& a = last("choices");
  if (a.is_input || a.attr_type != AttrType::kString) {
    build_errors_.push_back("argument " + a.name + ": choices() applies to string attributes");
  }
  a.choices = std::move(values);
  return *this;
}
OpDecl& OpDecl::since(int version) {
  last("since").since = version;
  return *this;
}
OpDecl& OpDecl::types(std::string type_var, std::vector<ElemType> types) {
  derived_.finished = false;
  type_vars_.push_back({std::move(type_var), std::move(types)});
  return *this;
}
OpDecl& OpDecl::output(std::string name, std::string type_var, std::string rule, std::string doc) {
  derived_.finished = false;
  OutputDecl o;
  o.name = std::move(name);
  o.type_var = std::move(type_var);
  o.rule = std::move(rule);
  o.doc = std::move(doc);
  outputs_.push_back(std::move(o));
  return *this;
}
OpDecl& OpDecl::not_differentiable() {
  derived_.finished = false;
  if (outputs_.empty()) {
    build_errors_.push_back("not_differentiable() before any output was declared");
  } else {
    outputs_.back().declared_not_differentiable = true;
  }
  return *this;
}
OpDecl& OpDecl::keeps_memory_format() {
  if (outputs_.empty()) {
    build_errors_.push_back("keeps_memory_format() before any output was declared");
  } else {
    outputs_.back().keeps_memory_format = true;
  }
  return *this;
}
OpDecl& OpDecl::output_shape_fn(OutputShapeFn fn) {
  output_shape_ = fn;
  return *this;
}

OpDecl& OpDecl::check(ValidateFn fn) {
  validate_ = fn;
  return *this;
}
OpDecl& OpDecl::args_of(const OpDecl& forward) {
  if (!forward.error().empty()) build_errors_.push_back("args_of(" + forward.name() + "): " + forward.error());
  if (args_of_ != nullptr && args_of_ != &forward) {
    build_errors_.push_back("args_of(" + forward.name() + "): the op takes the arguments of " + args_of_->name() +
                            " already (its checks run on them; an op has one forward)");
  }
  args_of_ = &forward;
  for (const ArgDecl& a : forward.args()) {
    ArgDecl copy = a;
    copy.input_index = copy.attr_index = -1;
    copy.gradient = false;
    add(std::move(copy));
  }
  for (const TypeVarDecl& t : forward.type_vars()) {
    if (type_var(t.name) == nullptr) types(t.name, t.types);
  }
  return *this;
}
OpDecl& OpDecl::gradient_of(const OpDecl& forward, std::vector<std::string> wrt) {
  derived_.finished = false;
  gradient_of_ = &forward;
  gradient_wrt_ = std::move(wrt);
  return *this;
}

// ---------------------------------------------------------------- OpDecl reading

int OpDecl::latest_version() const {
  int v = since_;
  for (const ArgDecl& a : args_) v = std::max(v, a.since);
  return v;
}

const TypeVarDecl* OpDecl::type_var(std::string_view n) const {
  for (const TypeVarDecl& t : type_vars_) {
    if (t.name == n) return &t;
  }
  return nullptr;
}

int64_t OpDecl::input_index(std::string_view n) const {
  finish();
  for (size_t i = 0; i < derived_.inputs.size(); ++i) {
    if (derived_.inputs[i]->name == n) return static_cast<int64_t>(i);
  }
  return -1;
}

int64_t OpDecl::attr_index(std::string_view n) const {
  finish();
  for (size_t i = 0; i < derived_.attrs.size(); ++i) {
    if (derived_.attrs[i]->name == n) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace opbridge
