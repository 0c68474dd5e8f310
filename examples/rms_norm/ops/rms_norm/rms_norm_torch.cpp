// torch ops myops::rms_norm and rms_norm_backward: schemas and checks from the declarations
// (rms_norm_decl.cpp), CPU implementations here, on the LibTorch stable ABI: the library built from
// this loads into every torch from the release opbridge targets on (opbridge_TORCH_TARGET). The
// fake kernels come from the declarations too, the autograd formula from the Python package
// (ops/rms_norm.py).
#include <opbridge/torch/torch_common.h>

#include "rms_norm.h"

namespace myops {
namespace {

using namespace opbridge::torch_adapter;

// The declaration's checks have passed when this runs (OPBRIDGE_DECLARED_KERNEL).
void rms_norm_cpu_impl(TorchCall& c) {
  const Tensor xc = contiguous(c.in("x")), wc = contiguous(c.in("weight"));
  const double eps = c.call().attr_float("eps");
  Tensor y = empty_like(xc);
  const RmsNormDims d = rms_norm_dims(c.call());
  c.check(opbridge::dispatch<float, double>(c.call().in("x").type, [&](auto tag) {
    using T = decltype(tag);
    return rms_norm_cpu<T>(ptr<T>(xc), ptr<T>(wc), mutable_ptr<T>(y), d, eps, torch_parallel());
  }));
  c.set_output(0, std::move(y));
}

void rms_norm_backward_cpu_impl(TorchCall& c) {
  const Tensor gc = contiguous(c.in("grad")), xc = contiguous(c.in("x")), wc = contiguous(c.in("weight"));
  const double eps = c.call().attr_float("eps");
  Tensor grad_x = empty_like(xc), grad_weight = empty_like(wc);
  const RmsNormDims d = rms_norm_dims(c.call());
  c.check(opbridge::dispatch<float, double>(c.call().in("x").type, [&](auto tag) {
    using T = decltype(tag);
    return rms_norm_backward_cpu<T>(ptr<T>(gc), ptr<T>(xc), ptr<T>(wc), mutable_ptr<T>(grad_x),
                                mutable_ptr<T>(grad_weight), d, eps, torch_parallel());
  }));
  c.set_output(0, std::move(grad_x));
  c.set_output(1, std::move(grad_weight));
}

}  // namespace

OPBRIDGE_TORCH_LIBRARY_FRAGMENT(m) {
  define_op(m, rms_norm_decl());
  define_op(m, rms_norm_backward_decl());
}

OPBRIDGE_TORCH_LIBRARY_IMPL(CPU, m) {
  m.impl("rms_norm", OPBRIDGE_DECLARED_KERNEL(rms_norm_decl, rms_norm_cpu_impl));
  m.impl("rms_norm_backward", OPBRIDGE_DECLARED_KERNEL(rms_norm_backward_decl, rms_norm_backward_cpu_impl));
}

}  // namespace myops
