// torch op opbridge::inverse: schema (from the declaration, inverse_decl.cpp) and CPU
// implementation on the stable ABI; the fake kernel comes from the declaration too, the autograd
// formula from opbridge/ops/inverse.py.
#include "opbridge/inverse.h"
#include "torch_common.h"

namespace opbridge::torch_adapter {
namespace {

constexpr const char* kOp = "opbridge::inverse";

void inverse_cpu_impl(TorchCall& c) {
  const Tensor& x = c.in("x");
  const bool nan_on_singular = c.call().attr_string("on_singular") == "nan";
  const InverseDims d = inverse_dims(sizes(x));
  const Tensor xc = contiguous(x);
  Tensor y = empty_like(xc);
  const Status status =
      dtype(x) == ScalarType::Float
          ? inverse_cpu<float>(ptr<float>(xc), mutable_ptr<float>(y), d.batch, d.n, torch_parallel(), CpuIsa::kAuto,
                               nan_on_singular)
          : inverse_cpu<double>(ptr<double>(xc), mutable_ptr<double>(y), d.batch, d.n, torch_parallel(),
                                CpuIsa::kAuto, nan_on_singular);
  // A singular matrix raises torch.linalg.LinAlgError (through opbridge.ops), as torch.linalg.inv
  // does; other failures raise as usual.
  if (status.code() == StatusCode::kRuntimeError) throw_error(kLinAlgErrorTag, kOp, status.message());
  c.check(status);
  c.set_output(0, std::move(y));
}

}  // namespace

OPBRIDGE_TORCH_LIBRARY_FRAGMENT(m) { define_op(m, inverse_decl()); }

OPBRIDGE_TORCH_LIBRARY_IMPL(CPU, m) { m.impl("inverse", OPBRIDGE_DECLARED_KERNEL(inverse_decl, inverse_cpu_impl)); }

}  // namespace opbridge::torch_adapter
