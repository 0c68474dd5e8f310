#include "torch_common.h"

#include <ATen/Parallel.h>

namespace opbridge::torch_adapter {

namespace {
void torch_runner(void*, int64_t n, int64_t grain, ParallelFor::Body body, void* body_ctx) {
  at::parallel_for(0, n, grain, [&](int64_t b, int64_t e) { body(body_ctx, b, e); });
}
}  // namespace

ParallelFor torch_parallel() { return ParallelFor(torch_runner, nullptr); }

void check_status(const Status& status, const char* op) {
  if (status.ok()) return;
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      TORCH_CHECK_VALUE(false, op, ": ", status.message());
    case StatusCode::kNotImplemented:
      TORCH_CHECK_NOT_IMPLEMENTED(false, op, ": ", status.message());
    case StatusCode::kTypeError:
      TORCH_CHECK_TYPE(false, op, ": ", status.message());
    default:
      TORCH_CHECK(false, op, ": ", status.message());
  }
}

void check_float_dtype(const at::Tensor& t, const char* op, const char* arg) {
  const auto s = t.scalar_type();
  TORCH_CHECK_TYPE(s == at::kFloat || s == at::kDouble || s == at::kHalf || s == at::kBFloat16, op, ": ",
                   arg, " must be a floating tensor (float32, float64, float16 or bfloat16), got ", s);
}

void check_param(const std::optional<at::Tensor>& p, const at::Tensor& x, const char* op, const char* arg) {
  if (!p.has_value() || !p->defined()) return;
  TORCH_CHECK_TYPE(p->scalar_type() == x.scalar_type(), op, ": ", arg, " must have the dtype of x (",
                   x.scalar_type(), "), got ", p->scalar_type());
  TORCH_CHECK_VALUE(p->device() == x.device(), op, ": ", arg, " must be on x's device (", x.device(),
                    "), got ", p->device());
  TORCH_CHECK_VALUE(p->dim() == 1, op, ": ", arg, " must be 1-D (one value per channel), got shape ",
                    p->sizes());
}

}  // namespace opbridge::torch_adapter
