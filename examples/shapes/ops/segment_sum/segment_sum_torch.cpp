// torch ops shapes::segment_sum and segment_sum_backward: schemas and checks from the declarations
// (segment_sum_decl.cpp), CPU implementations here, on the LibTorch stable ABI: the library built from
// this loads into every torch from the release opbridge targets on (opbridge_TORCH_TARGET). The
// fake kernels come from the declarations too, the autograd formula from the Python package
// (ops/segment_sum.py).
#include <opbridge/torch/torch_common.h>

#include "segment_sum.h"

namespace shapes {
namespace {

using namespace opbridge::torch_adapter;

// The declaration's checks have passed when this runs (OPBRIDGE_DECLARED_KERNEL).
void segment_sum_cpu_impl(TorchCall& c) {
  const Tensor vc = contiguous(c.in("values"));
  const Tensor& ids = c.host("segment_ids");  // host_memory: contiguous, on the CPU
  Tensor y = empty(opbridge::output_shape(c.call(), 0), dtype(vc), vc);
  c.check(opbridge::dispatch<float, double>(c.call().in("values").type, [&](auto tag) {
    using T = decltype(tag);
    return segment_sum_cpu<T>(ptr<T>(vc), ptr<int64_t>(ids), mutable_ptr<T>(y), segment_sum_dims(c.call()),
                              torch_parallel());
  }));
  c.set_output(0, std::move(y));
}

void segment_sum_backward_cpu_impl(TorchCall& c) {
  const Tensor gc = contiguous(c.in("grad"));
  const Tensor& ids = c.host("segment_ids");
  Tensor grad_values = empty_like(c.in("values"));
  c.check(opbridge::dispatch<float, double>(c.call().in("values").type, [&](auto tag) {
    using T = decltype(tag);
    return segment_sum_backward_cpu<T>(ptr<T>(gc), ptr<int64_t>(ids), mutable_ptr<T>(grad_values),
                                       segment_sum_dims(c.call()), torch_parallel());
  }));
  c.set_output(0, std::move(grad_values));
}

}  // namespace

OPBRIDGE_TORCH_LIBRARY_FRAGMENT(m) {
  define_op(m, segment_sum_decl());
  define_op(m, segment_sum_backward_decl());
}

OPBRIDGE_TORCH_LIBRARY_IMPL(CPU, m) {
  m.impl("segment_sum", OPBRIDGE_DECLARED_KERNEL(segment_sum_decl, segment_sum_cpu_impl));
  m.impl("segment_sum_backward", OPBRIDGE_DECLARED_KERNEL(segment_sum_backward_decl, segment_sum_backward_cpu_impl));
}

}  // namespace shapes
