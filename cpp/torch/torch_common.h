// opbridge torch adapter helpers: status translation, thread pool, dtype dispatch.
// Deliberately light: ATen/core/Tensor.h, not torch/extension.h (compile time on 2 cores).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <optional>
#include <string>

#include "opbridge/dtype.h"
#include "opbridge/parallel.h"
#include "opbridge/status.h"

namespace opbridge::torch_adapter {

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
