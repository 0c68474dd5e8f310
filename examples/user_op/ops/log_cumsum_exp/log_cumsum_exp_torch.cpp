// torch op userops::log_cumsum_exp(Tensor x, int dim): schema and checks from the declaration
// (log_cumsum_exp_decl.cpp), CPU implementation here, on the LibTorch stable ABI (one build for
// every torch from the release opbridge targets on); the fake kernel comes from the declaration too.
#include <opbridge/torch/torch_common.h>

#include "log_cumsum_exp.h"

namespace userops {
namespace {

using namespace opbridge::torch_adapter;

void log_cumsum_exp_cpu_impl(TorchCall& c) {
  const Tensor xc = contiguous(c.in("x"));
  Tensor y = empty_like(xc);
  const ScanDims d = log_cumsum_exp_dims(c.call());
  c.check(opbridge::dispatch<float, double>(c.call().in("x").type, [&](auto tag) {
    using T = decltype(tag);
    return log_cumsum_exp_cpu<T>(ptr<T>(xc), mutable_ptr<T>(y), d, torch_parallel());
  }));
  c.set_output(0, std::move(y));
}

}  // namespace

// The namespace (userops) is opbridge_add_op's NAMESPACE.
OPBRIDGE_TORCH_LIBRARY_FRAGMENT(m) { define_op(m, log_cumsum_exp_decl()); }
OPBRIDGE_TORCH_LIBRARY_IMPL(CPU, m) {
  m.impl("log_cumsum_exp", OPBRIDGE_DECLARED_KERNEL(log_cumsum_exp_decl, log_cumsum_exp_cpu_impl));
}

}  // namespace userops
