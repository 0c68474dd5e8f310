// One call of a declared op (OpCall) and its generic checks against the declaration: types,
// ranks, shapes, attributes, gradients; the version of the op a call needs.
#include "opbridge/op_decl.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace opbridge {

OpCall::OpCall(const OpDecl& decl) : decl_(&decl) {
  decl.finish();
  inputs_.resize(decl.inputs().size());
  attrs_.reserve(decl.attrs().size());
  for (const ArgDecl* a : decl.attrs()) attrs_.push_back(a->default_value);
}

const TensorArg& OpCall::in(std::string_view name) const {
  const int64_t i = decl_->input_index(name);
  if (i < 0) throw std::logic_error("op " + decl_->name() + " has no input " + std::string(name));
  return inputs_[static_cast<size_t>(i)];
}
TensorArg& OpCall::in(std::string_view name) {
  return const_cast<TensorArg&>(static_cast<const OpCall*>(this)->in(name));
}

const AttrValue& OpCall::attr_named(std::string_view name, AttrType type) const {
  const int64_t i = decl_->attr_index(name);
  if (i < 0) throw std::logic_error("op " + decl_->name() + " has no attribute " + std::string(name));
  const AttrValue& v = attrs_[static_cast<size_t>(i)];
  if (v.type != type && !(type == AttrType::kInt && v.type == AttrType::kBool)) {
    throw std::logic_error("attribute " + std::string(name) + " of op " + decl_->name() + " is not " +
                           attr_type_name(type));
  }
  return v;
}

void OpCall::set_int(std::string_view n, int64_t v) { const_cast<AttrValue&>(attr_named(n, AttrType::kInt)).i = v; }
void OpCall::set_float(std::string_view n, double v) {
  const_cast<AttrValue&>(attr_named(n, AttrType::kFloat)).f = v;
}
void OpCall::set_string(std::string_view n, std::string v) {
  const_cast<AttrValue&>(attr_named(n, AttrType::kString)).s = std::move(v);
}

int64_t OpCall::attr_int(std::string_view n) const { return attr_named(n, AttrType::kInt).i; }
double OpCall::attr_float(std::string_view n) const { return attr_named(n, AttrType::kFloat).f; }
bool OpCall::attr_bool(std::string_view n) const { return attr_named(n, AttrType::kBool).i != 0; }
const std::string& OpCall::attr_string(std::string_view n) const { return attr_named(n, AttrType::kString).s; }
const std::vector<int64_t>& OpCall::attr_ints(std::string_view n) const { return attr_named(n, AttrType::kInts).ints; }
const std::vector<double>& OpCall::attr_floats(std::string_view n) const {
  return attr_named(n, AttrType::kFloats).floats;
}

// ---------------------------------------------------------------- checks

namespace {

std::string type_list(const std::vector<ElemType>& types) {
  std::string s;
  for (size_t i = 0; i < types.size(); ++i) {
    if (i > 0) s += i + 1 == types.size() ? " or " : ", ";
    s += elem_type_name(types[i]);
  }
  return s;
}

std::string shape_suffix(const ArgDecl& a) { return a.shape_doc.empty() ? "" : " " + a.shape_doc; }

bool same_value(const AttrValue& a, const AttrValue& b) {
  switch (a.type) {
    case AttrType::kInt:
    case AttrType::kBool: return a.i == b.i;
    case AttrType::kFloat: return a.f == b.f || (std::isnan(a.f) && std::isnan(b.f));
    case AttrType::kString: return a.s == b.s;
    case AttrType::kInts: return a.ints == b.ints;
    case AttrType::kFloats: return a.floats == b.floats;
  }
  return false;
}

}  // namespace

Status check_attributes(const OpCall& call) {
  const OpDecl& d = call.decl();
  for (const ArgDecl* a : d.attrs()) {
    const AttrValue& v = call.attr(static_cast<size_t>(a->attr_index));
    if (a->choices.empty()) continue;
    bool ok = false;
    std::string list;
    for (size_t i = 0; i < a->choices.size(); ++i) {
      ok = ok || a->choices[i] == v.s;
      list += (i == 0 ? "'" : i + 1 == a->choices.size() ? " or '" : ", '") + a->choices[i] + "'";
    }
    if (!ok) return Status::InvalidArgument(a->name + " must be " + list + ", got '" + v.s + "'");
  }
  return Status::Ok();
}

Status check_index_values(const OpCall& call, std::string_view name, int64_t lo, int64_t hi) {
  const TensorArg& t = call.in(name);
  const int64_t* v = t.int64_data();
  const int64_t n = t.numel();
  for (int64_t i = 0; v != nullptr && i < n; ++i) {
    if (v[i] < lo || v[i] >= hi) {
      return Status::InvalidArgument(std::string(name) + "[" + std::to_string(i) + "] = " + std::to_string(v[i]) +
                                     " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + ")");
    }
  }
  return Status::Ok();
}

OpCall forward_call(const OpCall& backward) {
  const OpDecl* fwd = backward.decl().forward();
  if (fwd == nullptr) throw std::logic_error("forward_call: op " + backward.decl().name() + " has no forward");
  OpCall call(*fwd);
  for (const ArgDecl* a : fwd->inputs()) call.input(static_cast<size_t>(a->input_index)) = backward.in(a->name);
  for (const ArgDecl* a : fwd->attrs()) {
    const int64_t i = backward.decl().attr_index(a->name);
    call.attr(static_cast<size_t>(a->attr_index)) = backward.attr(static_cast<size_t>(i));
  }
  return call;
}

namespace {

std::string dims_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + (shape[i] >= 0 ? std::to_string(shape[i]) : "?");
  return s + "]";
}

// Gradient input k of a backward op has the shape forward output k has for the same arguments
// (`fc`, forward_call(call); where both are known: shape inference and fake kernels may not know
// every size).
Status check_gradient_shapes(const OpCall& call, const OpCall& fc) {
  const OpDecl& fwd = fc.decl();
  // The k-th gradient input is that of the k-th differentiable output.
  std::vector<size_t> differentiable;
  for (size_t o = 0; o < fwd.outputs().size(); ++o) {
    if (fwd.outputs()[o].differentiable) differentiable.push_back(o);
  }
  size_t k = 0;
  for (const ArgDecl* a : call.decl().inputs()) {
    if (!a->gradient && a->forward_output < 0) continue;
    const size_t out = a->gradient ? differentiable.at(k++) : static_cast<size_t>(a->forward_output);
    const TensorArg& g = call.input(static_cast<size_t>(a->input_index));
    if (!g.present || !g.rank_known) continue;
    const OutputDecl& o = fwd.outputs().at(out);
    const std::vector<int64_t> want = output_shape(fc, out);
    if (want.empty() && o.like_input >= 0) continue;  // the rank of the input it is like is unknown
    bool same = g.rank() == static_cast<int64_t>(want.size());
    for (size_t i = 0; same && i < want.size(); ++i) {
      same = want[i] < 0 || g.shape[i] < 0 || g.shape[i] == want[i];
    }
    if (!same) {
      return Status::InvalidArgument(a->name + " must have the shape of " + fwd.name() + "'s output " + o.name + " " +
                                     dims_string(want) + " (rule '" + o.rule + "'), got " + dims_string(g.shape));
    }
  }
  return Status::Ok();
}

}  // namespace

Status check_call(const OpCall& call) {
  const OpDecl& d = call.decl();
  if (!d.error().empty()) return Status::InvalidArgument(d.error());
  // Element types: allowed, and equal across the inputs of one type variable.
  for (const TypeVarDecl& tv : d.type_vars()) {
    const TensorArg* first = nullptr;
    const ArgDecl* first_decl = nullptr;
    for (const ArgDecl* a : d.check_order()) {
      if (a->type_var != tv.name) continue;
      const TensorArg& t = call.input(static_cast<size_t>(a->input_index));
      if (!t.present || t.type == ElemType::kUndefined) continue;
      bool ok = false;
      for (ElemType e : tv.types) ok = ok || e == t.type;
      if (!ok) {
        const std::string list = type_list(tv.types);
        // "an int64 tensor", "a float32 tensor"
        const char* article = list[0] == 'i' ? "an " : "a ";
        return Status(StatusCode::kTypeError,
                      a->name + " must be " + article + list + " tensor, got " + elem_type_name(t.type));
      }
      if (first == nullptr) {
        first = &t;
        first_decl = a;
      } else if (t.type != first->type) {
        return Status(StatusCode::kTypeError, a->name + " must have the dtype of " + first_decl->name + " (" +
                                                  elem_type_name(first->type) + "), got " + elem_type_name(t.type));
      }
    }
  }
  for (const ArgDecl* a : d.inputs()) {
    const TensorArg& t = call.input(static_cast<size_t>(a->input_index));
    if (!t.present) {
      if (!a->optional) return Status::InvalidArgument("input " + a->name + " is required but missing");
      continue;
    }
    if (!t.rank_known) continue;
    if (a->rank >= 0 && t.rank() != a->rank) {
      return Status::InvalidArgument(a->name + " must have rank " + std::to_string(a->rank) + shape_suffix(*a) +
                                     ", got rank " + std::to_string(t.rank()));
    }
    if (a->min_rank >= 0 && t.rank() < a->min_rank) {
      return Status::InvalidArgument(a->name + " must have rank >= " + std::to_string(a->min_rank) +
                                     shape_suffix(*a) + ", got rank " + std::to_string(t.rank()));
    }
  }
  OPBRIDGE_RETURN_IF_ERROR(check_attributes(call));
  // A backward op: first every check of its forward on the forward's arguments, however the
  // backward was declared (its kernel trusts them as the forward's does), ...
  const OpDecl* fwd = d.forward();
  std::optional<OpCall> fc;
  if (fwd != nullptr) {
    fc.emplace(forward_call(call));
    OPBRIDGE_RETURN_IF_ERROR(check_call(*fc));
  }
  // ... then its own (unless it is the forward's, which just ran), ...
  if (d.validate_fn() != nullptr && (fwd == nullptr || d.validate_fn() != fwd->validate_fn())) {
    OPBRIDGE_RETURN_IF_ERROR(d.validate_fn()(call));
  }
  // ... then each gradient has the shape of the forward output it is the gradient of.
  if (d.gradient_of() != nullptr) OPBRIDGE_RETURN_IF_ERROR(check_gradient_shapes(call, *fc));
  // Output sizes the rules give (after the op's own checks, whose messages say more).
  for (const OutputDecl& o : d.outputs()) {
    for (const auto& expr : o.dims) {
      std::string error;
      eval_dim(call, expr, &error);
      if (!error.empty()) {
        return Status::InvalidArgument("output " + o.name + ": shape rule '" + o.rule + "' " + error);
      }
    }
  }
  return Status::Ok();
}

ElemType output_type(const OpCall& call, size_t output) {
  const OutputDecl& o = call.decl().outputs().at(output);
  for (const ArgDecl* a : call.decl().inputs()) {
    const TensorArg& t = call.input(static_cast<size_t>(a->input_index));
    if (a->type_var == o.type_var && t.present) return t.type;
  }
  const TypeVarDecl* tv = call.decl().type_var(o.type_var);
  return tv != nullptr && tv->types.size() == 1 ? tv->types[0] : ElemType::kUndefined;
}

int required_version(const OpCall& call) {
  const OpDecl& d = call.decl();
  int v = d.since_version();
  for (const ArgDecl* a : d.inputs()) {
    if (call.input(static_cast<size_t>(a->input_index)).present) v = std::max(v, a->since);
  }
  for (const ArgDecl* a : d.attrs()) {
    if (!a->has_default || !same_value(call.attr(static_cast<size_t>(a->attr_index)), a->default_value)) {
      v = std::max(v, a->since);
    }
  }
  return v;
}

}  // namespace opbridge
