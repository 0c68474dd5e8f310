// torch ops shapes::bias_act and bias_act_backward: schemas and checks from the declarations
// (bias_act_decl.cpp), CPU implementations here, on the LibTorch stable ABI: the library built from
// this loads into every torch from the release opbridge targets on (opbridge_TORCH_TARGET). The
// fake kernels come from the declarations too, the autograd formula from the Python package
// (ops/bias_act.py).
#include <opbridge/torch/torch_common.h>

#include "bias_act.h"

namespace shapes {
namespace {

using namespace opbridge::torch_adapter;

// The declaration's checks have passed when this runs (OPBRIDGE_DECLARED_KERNEL).
void bias_act_cpu_impl(TorchCall& c) {
  const Tensor xc = contiguous(c.in("x"));
  const bool has_bias = c.call().in("bias").present;
  const Tensor bc = has_bias ? contiguous(c.in("bias")) : xc;
  Tensor y = empty_like(xc);
  const int64_t C = c.call().in("x").dim(-1), rows = C ? c.call().in("x").numel() / C : 0;
  c.check(opbridge::dispatch<float, double>(c.call().in("x").type, [&](auto tag) {
    using T = decltype(tag);
    return bias_act_cpu<T>(ptr<T>(xc), has_bias ? ptr<T>(bc) : nullptr, mutable_ptr<T>(y), rows, C,
                           bias_act_code(c.call().attr_string("activation")));
  }));
  c.set_output(0, std::move(y));
}

void bias_act_backward_cpu_impl(TorchCall& c) {
  const Tensor gc = contiguous(c.in("grad")), xc = contiguous(c.in("x"));
  const bool has_bias = c.call().in("bias").present;
  const Tensor bc = has_bias ? contiguous(c.in("bias")) : xc;
  const int64_t C = c.call().in("x").dim(-1), rows = C ? c.call().in("x").numel() / C : 0;
  Tensor grad_x = empty_like(xc), grad_bias = empty({C}, dtype(xc), xc);
  c.check(opbridge::dispatch<float, double>(c.call().in("x").type, [&](auto tag) {
    using T = decltype(tag);
    return bias_act_backward_cpu<T>(ptr<T>(gc), ptr<T>(xc), has_bias ? ptr<T>(bc) : nullptr, mutable_ptr<T>(grad_x),
                                    mutable_ptr<T>(grad_bias), rows, C, bias_act_code(c.call().attr_string("activation")));
  }));
  c.set_output(0, std::move(grad_x));
  c.set_output(1, std::move(grad_bias));
}

}  // namespace

OPBRIDGE_TORCH_LIBRARY_FRAGMENT(m) {
  define_op(m, bias_act_decl());
  define_op(m, bias_act_backward_decl());
}

OPBRIDGE_TORCH_LIBRARY_IMPL(CPU, m) {
  m.impl("bias_act", OPBRIDGE_DECLARED_KERNEL(bias_act_decl, bias_act_cpu_impl));
  m.impl("bias_act_backward", OPBRIDGE_DECLARED_KERNEL(bias_act_backward_decl, bias_act_backward_cpu_impl));
}

}  // namespace shapes
