// torch ops myops::rms_norm and rms_norm_backward: schemas and checks from the declarations
// (rms_norm_decl.cpp), CPU implementations here. The fake kernels come from the declarations too,
// the autograd formula from the Python package (ops/rms_norm.py). Light headers only: torch/extension.h
// costs several times the compile time.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <tuple>

#include <opbridge/torch/torch_common.h>

#include "rms_norm.h"

namespace myops {
namespace {

using namespace opbridge::torch_adapter;

at::Tensor rms_norm_cpu_impl(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const CheckedCall c = check_call(rms_norm_decl(), {x, weight, eps});
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  at::Tensor y = at::empty_like(xc);
  const RmsNormDims d = rms_norm_dims(c.call);
  c.check(opbridge::dispatch<float, double>(c.call.in("x").type, [&](auto tag) {
    using T = decltype(tag);
    return rms_norm_cpu<T>(ptr<T>(xc), ptr<T>(wc), mutable_ptr<T>(y), d, eps, torch_parallel());
  }));
  return y;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cpu_impl(const at::Tensor& grad, const at::Tensor& x,
                                                         const at::Tensor& weight, double eps) {
  const CheckedCall c = check_call(rms_norm_backward_decl(), {grad, x, weight, eps});
  const at::Tensor gc = grad.contiguous(), xc = x.contiguous(), wc = weight.contiguous();
  at::Tensor grad_x = at::empty_like(xc), grad_weight = at::empty_like(wc);
  const RmsNormDims d = rms_norm_dims(c.call);
  c.check(opbridge::dispatch<float, double>(c.call.in("x").type, [&](auto tag) {
    using T = decltype(tag);
    return rms_norm_backward_cpu<T>(ptr<T>(gc), ptr<T>(xc), ptr<T>(wc), mutable_ptr<T>(grad_x),
                                mutable_ptr<T>(grad_weight), d, eps, torch_parallel());
  }));
  return {grad_x, grad_weight};
}

}  // namespace

OPBRIDGE_TORCH_LIBRARY_FRAGMENT(m) {
  define_op(m, rms_norm_decl());
  define_op(m, rms_norm_backward_decl());
}

OPBRIDGE_TORCH_LIBRARY_IMPL(CPU, m) {
  m.impl("rms_norm", &rms_norm_cpu_impl);
  m.impl("rms_norm_backward", &rms_norm_backward_cpu_impl);
}

}  // namespace myops
