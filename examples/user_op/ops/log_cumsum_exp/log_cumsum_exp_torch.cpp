// torch op userops::log_cumsum_exp(Tensor x, int dim): schema and CPU implementation, on
// opbridge's torch adapter helpers. Light headers only (compile time).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <opbridge/torch/torch_common.h>

#include "userops/log_cumsum_exp.h"

namespace userops {
namespace {

constexpr const char* kOp = "userops::log_cumsum_exp";

at::Tensor log_cumsum_exp_cpu_impl(const at::Tensor& x, int64_t dim) {
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, kOp,
                   ": x must be float32 or float64, got ", x.scalar_type());
  ScanDims dims;
  opbridge::torch_adapter::check_status(log_cumsum_exp_check(x.sizes().vec(), dim, &dims, "dim"), kOp);
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc, at::MemoryFormat::Contiguous);
  const auto pf = opbridge::torch_adapter::torch_parallel();
  if (x.scalar_type() == at::kFloat) {
    opbridge::torch_adapter::check_status(
        log_cumsum_exp_cpu<float>(xc.const_data_ptr<float>(), y.mutable_data_ptr<float>(), dims, pf), kOp);
  } else {
    opbridge::torch_adapter::check_status(
        log_cumsum_exp_cpu<double>(xc.const_data_ptr<double>(), y.mutable_data_ptr<double>(), dims, pf), kOp);
  }
  return y;
}

}  // namespace

TORCH_LIBRARY(userops, m) {
  m.def("log_cumsum_exp(Tensor x, int dim) -> Tensor", {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(userops, CPU, m) { m.impl("log_cumsum_exp", &log_cumsum_exp_cpu_impl); }

}  // namespace userops
