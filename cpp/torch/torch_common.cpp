#include "torch_common.h"

#include <ATen/Parallel.h>

namespace opbridge::torch_adapter {

namespace {
void torch_runner(void*, int64_t n, int64_t grain, ParallelFor::Body body, void* body_ctx) {
  at::parallel_for(0, n, grain, [&](int64_t b, int64_t e) { body(body_ctx, b, e); });
}
}  // namespace

ParallelFor torch_parallel() { return ParallelFor(torch_runner, nullptr); }

void check_status(const Status& status, const char* op) {
  if (status.ok()) return;
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      TORCH_CHECK_VALUE(false, op, ": ", status.message());
    case StatusCode::kTypeError:
      TORCH_CHECK_TYPE(false, op, ": ", status.message());
    case StatusCode::kNotImplemented:
      TORCH_CHECK_NOT_IMPLEMENTED(false, op, ": ", status.message());
    default:
      TORCH_CHECK(false, op, ": ", status.message());
  }
}

void check_float_dtype(const at::Tensor& t, const char* op, const char* arg) {
  const auto s = t.scalar_type();
  TORCH_CHECK_TYPE(s == at::kFloat || s == at::kDouble || s == at::kHalf || s == at::kBFloat16, op, ": ",
                   arg, " must be a floating tensor (float32, float64, float16 or bfloat16), got ", s);
}

void check_param(const std::optional<at::Tensor>& p, const at::Tensor& x, const char* op, const char* arg) {
  if (!p.has_value() || !p->defined()) return;
  TORCH_CHECK_TYPE(p->scalar_type() == x.scalar_type(), op, ": ", arg, " must have the dtype of x (",
                   x.scalar_type(), "), got ", p->scalar_type());
  TORCH_CHECK_VALUE(p->device() == x.device(), op, ": ", arg, " must be on x's device (", x.device(),
                    "), got ", p->device());
  TORCH_CHECK_VALUE(p->dim() == 1, op, ": ", arg, " must be 1-D (one value per channel), got shape ",
                    p->sizes());
}

}  // namespace opbridge::torch_adapter

// ---------------------------------------------------------------- declared ops

#include <torch/library.h>

#include <ATen/ops/empty.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace opbridge::torch_adapter {

namespace {

std::string float_literal(double v) {
  std::string s = shortest_double(v);
  if (s.find_first_of(".eE") == std::string::npos) s += ".";
  return s;
}

std::string default_literal(const ArgDecl& a) {
  const AttrValue& v = a.default_value;
  switch (a.attr_type) {
    case AttrType::kInt: return std::to_string(v.i);
    case AttrType::kBool: return v.i ? "True" : "False";
    case AttrType::kFloat: return float_literal(v.f);
    case AttrType::kString: return "\"" + v.s + "\"";
    case AttrType::kInts: {
      std::string s = "[";
      for (size_t i = 0; i < v.ints.size(); ++i) s += (i ? ", " : "") + std::to_string(v.ints[i]);
      return s + "]";
    }
    case AttrType::kFloats: {
      std::string s = "[";
      for (size_t i = 0; i < v.floats.size(); ++i) s += (i ? ", " : "") + float_literal(v.floats[i]);
      return s + "]";
    }
  }
  return "";
}


ElemType elem_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ElemType::kFloat32;
    case at::kDouble: return ElemType::kFloat64;
    case at::kHalf: return ElemType::kFloat16;
    case at::kBFloat16: return ElemType::kBFloat16;
    case at::kByte: return ElemType::kUint8;
    case at::kChar: return ElemType::kInt8;
    case at::kShort: return ElemType::kInt16;
    case at::kInt: return ElemType::kInt32;
    case at::kLong: return ElemType::kInt64;
    case at::kBool: return ElemType::kBool;
    case at::kComplexFloat: return ElemType::kComplex64;
    case at::kComplexDouble: return ElemType::kComplex128;
    default: return ElemType::kUndefined;
  }
}

}  // namespace

// (0, 2, ..., rank - 1, 1): x.permute(this) is [N, *spatial, C].
std::vector<int64_t> channels_last_order(int64_t rank) {
  std::vector<int64_t> p{0};
  for (int64_t i = 2; i < rank; ++i) p.push_back(i);
  p.push_back(1);
  return p;
}

// Whether x is processed as [N, S, C]: its memory is channels-last and it is not also
// contiguous (where both hold, e.g. C = 1 or all spatial dims 1, the two views coincide); a
// single sample only with a batch stride of at least its size (torch's rule, see
// opbridge/ops/_declared.py: channels_last).
bool uses_channels_last(const at::Tensor& x) {
  if (x.dim() < 3 || x.is_contiguous() || !x.permute(channels_last_order(x.dim())).is_contiguous()) return false;
  return x.size(0) != 1 || x.stride(0) >= x.numel();
}

// A new tensor of x's sizes, channels-last (strides of a contiguous [N, *spatial, C] buffer) or
// contiguous.
at::Tensor empty_in_layout(const at::Tensor& x, bool channels_last) {
  if (!channels_last) return at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  const auto order = channels_last_order(x.dim());
  std::vector<int64_t> sizes;
  for (int64_t i : order) sizes.push_back(x.size(i));
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) inverse[order[i]] = static_cast<int64_t>(i);
  return at::empty(sizes, x.options()).permute(inverse);
}

// t in the given layout (a copy only where t's memory differs).
at::Tensor in_layout(const at::Tensor& t, bool channels_last) {
  if (!channels_last) return t.contiguous();
  if (t.permute(channels_last_order(t.dim())).is_contiguous()) return t;
  at::Tensor out = empty_in_layout(t, true);
  out.copy_(t);
  return out;
}

std::string torch_schema(const OpDecl& decl) {
  std::string s = decl.name() + "(";
  bool first = true;
  for (const ArgDecl& a : decl.args()) {
    s += first ? "" : ", ";
    first = false;
    if (a.is_input) {
      s += a.optional ? "Tensor? " + a.name + "=None" : "Tensor " + a.name;
    } else {
      s += std::string(attr_type_key(a.attr_type)) + " " + a.name;
      if (a.has_default) s += "=" + default_literal(a);
    }
  }
  s += ") -> ";
  if (decl.outputs().size() == 1) return s + "Tensor";
  s += "(";
  for (size_t i = 0; i < decl.outputs().size(); ++i) s += i ? ", Tensor" : "Tensor";
  return s + ")";
}

void define_op(torch::Library& m, const OpDecl& decl) {
  TORCH_CHECK(decl.error().empty(), "opbridge: misdeclared op: ", decl.error());
  const std::string schema = torch_schema(decl);
  m.def(schema.c_str(), {at::Tag::pt2_compliant_tag});
}

void CheckedCall::check(const Status& status) const { check_status(status, qualname.c_str()); }

const at::Tensor* Arg::tensor() const {
  if (tensor_ != nullptr) return tensor_->defined() ? tensor_ : nullptr;
  if (opt_ != nullptr && opt_->has_value() && (*opt_)->defined()) return &**opt_;
  return nullptr;
}

CheckedCall check_call(const OpDecl& decl, const char* qualname, std::initializer_list<Arg> args) {
  CheckedCall out{OpCall(decl), {}, qualname};
  TORCH_CHECK(args.size() == decl.args().size(), qualname, ": expected ", decl.args().size(), " arguments, got ",
              args.size());
  const at::Tensor* first = nullptr;
  const ArgDecl* first_decl = nullptr;
  size_t k = 0;
  for (const Arg& arg : args) {
    const ArgDecl& a = decl.args()[k++];
    if (a.is_input) {
      TensorArg& t = out.call.input(static_cast<size_t>(a.input_index));
      const at::Tensor* tensor = arg.tensor();
      if (tensor == nullptr) continue;
      t.present = true;
      t.type = elem_type(tensor->scalar_type());
      t.shape.assign(tensor->sizes().begin(), tensor->sizes().end());
      if (a.host_memory) {
        // Validation reads these values: a contiguous CPU copy (one sync for a device tensor).
        at::Tensor host = tensor->is_cpu() ? tensor->contiguous() : tensor->to(at::kCPU).contiguous();
        if (host.scalar_type() == at::kLong) t.data = host.const_data_ptr();
        out.host.push_back(std::move(host));
        continue;
      }
      if (first == nullptr) {
        first = tensor;
        first_decl = &a;
      } else {
        TORCH_CHECK_VALUE(tensor->device() == first->device(), qualname, ": ", a.name, " must be on ",
                          first_decl->name, "'s device (", first->device(), "), got ", tensor->device());
      }
    } else {
      AttrValue& v = out.call.attr(static_cast<size_t>(a.attr_index));
      v = arg.value();
      v.type = a.attr_type;
    }
  }
  check_status(opbridge::check_call(out.call), qualname);
  return out;
}

}  // namespace opbridge::torch_adapter
