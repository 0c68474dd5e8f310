// torch op opbridge::inverse: schema and CPU implementation (autograd and fake kernels are
// registered from Python, in opbridge/ops/inverse.py).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <string>
#include <string_view>

#include "opbridge/inverse.h"
#include "torch_common.h"

namespace opbridge::torch_adapter {
namespace {

constexpr const char* kOp = "opbridge::inverse";

at::Tensor inverse_cpu_impl(const at::Tensor& x, std::string_view on_singular) {
  bool nan_on_singular = false;
  check_status(inverse_parse_on_singular(std::string(on_singular).c_str(), &nan_on_singular), kOp);
  const auto st = x.scalar_type();
  TORCH_CHECK_TYPE(st == at::kFloat || st == at::kDouble, kOp, ": x must be a float32 or float64 tensor, got ", st);
  const int64_t r = x.dim();
  check_status(inverse_check(r, r >= 2 ? x.size(-2) : 0, r >= 1 ? x.size(-1) : 0), kOp);
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc, at::MemoryFormat::Contiguous);
  const int64_t n = x.size(-1);
  // An empty x has no matrices; only then could n * n overflow (x = [0, 2^32, 2^32] made it 0).
  const int64_t batch = x.numel() == 0 ? 0 : x.numel() / (n * n);
  const Status status = x.scalar_type() == at::kFloat
                            ? inverse_cpu<float>(ptr<float>(xc), mutable_ptr<float>(y), batch, n, torch_parallel(),
                                                 CpuIsa::kAuto, nan_on_singular)
                            : inverse_cpu<double>(ptr<double>(xc), mutable_ptr<double>(y), batch, n, torch_parallel(),
                                                  CpuIsa::kAuto, nan_on_singular);
  // A singular matrix raises torch.linalg.LinAlgError, as torch.linalg.inv does; other
  // failures raise as usual.
  TORCH_CHECK_LINALG(status.code() != StatusCode::kRuntimeError, kOp, ": ", status.message());
  check_status(status, kOp);
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opbridge, m) {
  // on_singular: "raise" (torch.linalg.LinAlgError naming the matrix) or "nan" (that matrix's
  // output is NaN, the others are computed); a trailing default keeps inverse(x) working.
  m.def("inverse(Tensor x, str on_singular=\"raise\") -> Tensor", {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(opbridge, CPU, m) { m.impl("inverse", &inverse_cpu_impl); }

}  // namespace opbridge::torch_adapter
