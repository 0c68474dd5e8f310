// torch op opbridge::inverse: schema (from the declaration, inverse_decl.cpp) and CPU
// implementation; the fake kernel comes from the declaration too, the autograd formula from
// opbridge/ops/inverse.py.
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

at::Tensor inverse_cpu_impl(const at::Tensor& x, c10::string_view on_singular) {
  check_call(inverse_decl(), kOp, {x, on_singular});
  const bool nan_on_singular = on_singular == "nan";
  const InverseDims d = inverse_dims({x.sizes().begin(), x.sizes().end()});
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc, at::MemoryFormat::Contiguous);
  const Status status =
      x.scalar_type() == at::kFloat
          ? inverse_cpu<float>(ptr<float>(xc), mutable_ptr<float>(y), d.batch, d.n, torch_parallel(),
                                 CpuIsa::kAuto, nan_on_singular)
          : inverse_cpu<double>(ptr<double>(xc), mutable_ptr<double>(y), d.batch, d.n, torch_parallel(),
                                  CpuIsa::kAuto, nan_on_singular);
  // A singular matrix raises torch.linalg.LinAlgError, as torch.linalg.inv does; other
  // failures raise as usual.
  TORCH_CHECK_LINALG(status.code() != StatusCode::kRuntimeError, kOp, ": ", status.message());
  check_status(status, kOp);
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opbridge, m) { define_op(m, inverse_decl()); }

TORCH_LIBRARY_IMPL(opbridge, CPU, m) { m.impl("inverse", &inverse_cpu_impl); }

}  // namespace opbridge::torch_adapter
