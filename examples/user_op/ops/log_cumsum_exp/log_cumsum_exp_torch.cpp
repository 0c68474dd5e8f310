// torch op userops::log_cumsum_exp(Tensor x, int dim): schema and checks from the declaration
// (log_cumsum_exp_decl.cpp), CPU implementation here; the fake kernel comes from the declaration
// too. Light headers only (compile time).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <opbridge/torch/torch_common.h>

#include "log_cumsum_exp.h"

namespace userops {
namespace {

using namespace opbridge::torch_adapter;

at::Tensor log_cumsum_exp_cpu_impl(const at::Tensor& x, int64_t dim) {
  const CheckedCall c = check_call(log_cumsum_exp_decl(), {x, dim});
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc);
  const ScanDims d = log_cumsum_exp_dims(c.call);
  c.check(opbridge::dispatch<float, double>(c.call.in("x").type, [&](auto tag) {
    using T = decltype(tag);
    return log_cumsum_exp_cpu<T>(ptr<T>(xc), mutable_ptr<T>(y), d, torch_parallel());
  }));
  return y;
}

}  // namespace

// The namespace (userops) is opbridge_add_op's NAMESPACE.
OPBRIDGE_TORCH_LIBRARY_FRAGMENT(m) { define_op(m, log_cumsum_exp_decl()); }
OPBRIDGE_TORCH_LIBRARY_IMPL(CPU, m) { m.impl("log_cumsum_exp", &log_cumsum_exp_cpu_impl); }

}  // namespace userops
