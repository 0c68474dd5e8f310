// torch ops shapes::window_stats and window_stats_backward: schemas and checks from the declarations
// (window_stats_decl.cpp), CPU implementations here, on the LibTorch stable ABI: the library built from
// this loads into every torch from the release opbridge targets on (opbridge_TORCH_TARGET). The
// fake kernels come from the declarations too, the autograd formula from the Python package
// (ops/window_stats.py).
#include <opbridge/torch/torch_common.h>

#include "window_stats.h"

namespace shapes {
namespace {

using namespace opbridge::torch_adapter;

// The declaration's checks have passed when this runs (OPBRIDGE_DECLARED_KERNEL).
void window_stats_cpu_impl(TorchCall& c) {
  const Tensor xc = contiguous(c.in("x"));
  Tensor sum = empty(opbridge::output_shape(c.call(), 0), dtype(xc), xc);
  Tensor sumsq = empty(opbridge::output_shape(c.call(), 1), dtype(xc), xc);
  c.check(opbridge::dispatch<float, double>(c.call().in("x").type, [&](auto tag) {
    using T = decltype(tag);
    return window_stats_cpu<T>(ptr<T>(xc), mutable_ptr<T>(sum), mutable_ptr<T>(sumsq), window_stats_dims(c.call()),
                               torch_parallel());
  }));
  c.set_output(0, std::move(sum));
  c.set_output(1, std::move(sumsq));
}

void window_stats_backward_cpu_impl(TorchCall& c) {
  const Tensor gs = contiguous(c.in("grad_sum")), gq = contiguous(c.in("grad_sumsq")), xc = contiguous(c.in("x"));
  Tensor grad_x = empty_like(xc);
  c.check(opbridge::dispatch<float, double>(c.call().in("x").type, [&](auto tag) {
    using T = decltype(tag);
    return window_stats_backward_cpu<T>(ptr<T>(gs), ptr<T>(gq), ptr<T>(xc), mutable_ptr<T>(grad_x),
                                        window_stats_dims(c.call()), torch_parallel());
  }));
  c.set_output(0, std::move(grad_x));
}

}  // namespace

OPBRIDGE_TORCH_LIBRARY_FRAGMENT(m) {
  define_op(m, window_stats_decl());
  define_op(m, window_stats_backward_decl());
}

OPBRIDGE_TORCH_LIBRARY_IMPL(CPU, m) {
  m.impl("window_stats", OPBRIDGE_DECLARED_KERNEL(window_stats_decl, window_stats_cpu_impl));
  m.impl("window_stats_backward", OPBRIDGE_DECLARED_KERNEL(window_stats_backward_decl, window_stats_backward_cpu_impl));
}

}  // namespace shapes
