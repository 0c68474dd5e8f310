// opbridge torch adapter helpers: status translation, thread pool, dtype dispatch.
// Deliberately light: ATen/core/Tensor.h, not torch/extension.h (compile time on 2 cores).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <c10/util/string_view.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "opbridge/dtype.h"
#include "opbridge/op_decl.h"
#include "opbridge/parallel.h"
#include "opbridge/status.h"

namespace torch {
class Library;
}

namespace opbridge::torch_adapter {

// ---- memory formats (ops whose outputs keep_memory_format(); the fake kernels follow the same
// rule, opbridge/ops/_declared.py: channels_last) ----
// (0, 2, ..., rank - 1, 1): x.permute(this) is [N, *spatial, C].
std::vector<int64_t> channels_last_order(int64_t rank);
// Whether x is processed as [N, S, C]: its memory is channels-last and it is not also
// contiguous (where both hold, e.g. C = 1 or all spatial dims 1, the two views coincide); a
// single sample (N = 1) only with a batch stride of at least its size, as torch decides.
bool uses_channels_last(const at::Tensor& x);
// A new tensor of x's sizes, channels-last (strides of a contiguous [N, *spatial, C] buffer) or
// contiguous.
at::Tensor empty_in_layout(const at::Tensor& x, bool channels_last);
// t in the given layout (a copy only where t's memory differs).
at::Tensor in_layout(const at::Tensor& t, bool channels_last);

// ---- declared ops (opbridge/op_decl.h) ----
// The torch schema of a declaration, e.g. "group_norm(Tensor x, int num_groups, Tensor? weight=None, ...) -> Tensor".
std::string torch_schema(const OpDecl& decl);
// m.def(torch_schema(decl)), tagged pt2-compliant. Throws (at library load) for a misdeclared op.
void define_op(torch::Library& m, const OpDecl& decl);

// One argument of a torch call, as a declared op's checks see it.
class Arg {
 public:
  Arg(const at::Tensor& t) : tensor_(&t) {}  // NOLINT: implicit by design
  Arg(const std::optional<at::Tensor>& t) : opt_(&t) {}  // NOLINT
  Arg(int64_t v) : kind_(AttrType::kInt) { value_.type = kind_; value_.i = v; }  // NOLINT
  Arg(double v) : kind_(AttrType::kFloat) { value_.type = kind_; value_.f = v; }  // NOLINT
  Arg(bool v) : kind_(AttrType::kBool) { value_.type = kind_; value_.i = v; }  // NOLINT
  Arg(c10::string_view v) : kind_(AttrType::kString) { value_.type = kind_; value_.s = std::string(v); }  // NOLINT
  Arg(const std::string& v) : kind_(AttrType::kString) { value_.type = kind_; value_.s = v; }  // NOLINT
  Arg(const char* v) : kind_(AttrType::kString) { value_.type = kind_; value_.s = v; }  // NOLINT
  const at::Tensor* tensor() const;  // nullptr for an absent optional tensor or an attribute
  bool is_tensor_arg() const { return tensor_ != nullptr || opt_ != nullptr; }
  const AttrValue& value() const { return value_; }

 private:
  const at::Tensor* tensor_ = nullptr;
  const std::optional<at::Tensor>* opt_ = nullptr;
  AttrType kind_ = AttrType::kInt;
  AttrValue value_;
};

// A checked call: the OpCall the declaration's checks passed, plus the contiguous host copies of
// host_memory inputs it points into.
struct CheckedCall {
  OpCall call;
  std::vector<at::Tensor> host;  // host_memory inputs, contiguous, on the CPU (declaration order)
  std::string qualname;          // "namespace::op", the prefix of messages

  // Throws a non-ok status (e.g. the kernel's) as the matching torch exception, prefixed with
  // the op's name, as check_status does.
  void check(const Status& status) const;
};
// Runs the declaration's checks on a call (arguments in schema order) and throws the matching
// torch exception ("<qualname>: <message>") when they fail; tensor inputs other than
// host_memory ones must be on the first input's device.
CheckedCall check_call(const OpDecl& decl, const char* qualname, std::initializer_list<Arg> args);

// ---- the library's torch namespace ----
// opbridge_add_op() compiles a library's torch sources with OPBRIDGE_TORCH_NAMESPACE defined to
// the library's NAMESPACE, so that op files need not restate it:
//   OPBRIDGE_TORCH_LIBRARY_FRAGMENT(m) { define_op(m, my_op_decl()); }
//   OPBRIDGE_TORCH_LIBRARY_IMPL(CPU, m) { m.impl("my_op", &my_op_cpu); }
//   check_call(my_op_decl(), {x, weight, eps})   // messages start with "<namespace>::my_op: "
#ifdef OPBRIDGE_TORCH_NAMESPACE
#define OPBRIDGE_TORCH_STR_(x) #x
#define OPBRIDGE_TORCH_STR(x) OPBRIDGE_TORCH_STR_(x)
// One more level of macros, so that OPBRIDGE_TORCH_NAMESPACE is expanded before torch's macros
// paste and stringify it.
#define OPBRIDGE_TORCH_FRAGMENT_(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)
#define OPBRIDGE_TORCH_IMPL_(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)
#define OPBRIDGE_TORCH_LIBRARY_FRAGMENT(m) OPBRIDGE_TORCH_FRAGMENT_(OPBRIDGE_TORCH_NAMESPACE, m)
#define OPBRIDGE_TORCH_LIBRARY_IMPL(key, m) OPBRIDGE_TORCH_IMPL_(OPBRIDGE_TORCH_NAMESPACE, key, m)
inline constexpr const char* kTorchNamespace = OPBRIDGE_TORCH_STR(OPBRIDGE_TORCH_NAMESPACE);
// "<namespace>::<op>", the torch name of a declared op of this library.
inline std::string qualname(const OpDecl& decl) { return std::string(kTorchNamespace) + "::" + decl.name(); }
inline CheckedCall check_call(const OpDecl& decl, std::initializer_list<Arg> args) {
  return check_call(decl, qualname(decl).c_str(), args);
}
#endif

// at::parallel_for, so kernels follow torch.set_num_threads.
ParallelFor torch_parallel();

// Throws the torch exception matching a non-ok Status (ValueError, NotImplementedError,
// RuntimeError, TypeError in Python), prefixed with the op name.
void check_status(const Status& status, const char* op);

// Checks that `t` is a floating tensor of a dtype the kernels support.
void check_float_dtype(const at::Tensor& t, const char* op, const char* arg);
// Checks an optional per-channel parameter: same dtype and device as x, one dimension.
void check_param(const std::optional<at::Tensor>& p, const at::Tensor& x, const char* op, const char* arg);

// Calls f(T{}) with T the opbridge element type matching `t`'s dtype.
template <class F>
decltype(auto) dispatch_float(at::ScalarType t, const char* op, F&& f) {
  switch (t) {
    case at::ScalarType::Float: return f(float{});
    case at::ScalarType::Double: return f(double{});
    case at::ScalarType::Half: return f(Half{});
    case at::ScalarType::BFloat16: return f(BFloat16{});
    default:
      TORCH_CHECK_NOT_IMPLEMENTED(false, op, ": unsupported dtype ", t,
                                  "; expected float32, float64, float16 or bfloat16");
  }
}

template <class T>
const T* ptr(const at::Tensor& t) {
  return static_cast<const T*>(t.const_data_ptr());
}
template <class T>
T* mutable_ptr(at::Tensor& t) {
  return static_cast<T*>(t.mutable_data_ptr());
}
template <class T>
const T* opt_ptr(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? ptr<T>(*t) : nullptr;
}

}  // namespace opbridge::torch_adapter
