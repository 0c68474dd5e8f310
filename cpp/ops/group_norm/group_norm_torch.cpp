// torch op opbridge::group_norm: schema (from the declaration, group_norm_decl.cpp) and CPU
// implementation; the fake kernel comes from the declaration too, the autograd formula from
// opbridge/ops/group_norm.py.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <tuple>

#include "opbridge/group_norm.h"
#include "torch_common.h"

namespace opbridge::torch_adapter {
namespace {

constexpr const char* kOp = "opbridge::group_norm";

std::optional<at::Tensor> contiguous(const std::optional<at::Tensor>& t) {
  if (!t.has_value() || !t->defined()) return std::nullopt;
  return t->contiguous();
}

std::vector<int64_t> shape_of(const at::Tensor& t) { return {t.sizes().begin(), t.sizes().end()}; }

at::Tensor group_norm_cpu_impl(const at::Tensor& x, int64_t num_groups, const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, double eps, c10::string_view activation) {
  check_call(group_norm_decl(), kOp, {x, num_groups, weight, bias, eps, activation});
  TORCH_CHECK_NOT_IMPLEMENTED(activation == "none", kOp, ": activation '", activation,
                              "' is not implemented by this build");
  const GroupNormDims d = group_norm_dims(shape_of(x), num_groups);
  const at::Tensor xc = x.contiguous();
  const auto wc = contiguous(weight), bc = contiguous(bias);
  at::Tensor y = at::empty_like(xc, at::MemoryFormat::Contiguous);
  dispatch_float(x.scalar_type(), kOp, [&](auto tag) {
    using T = decltype(tag);
    check_status(group_norm_cpu<T>(ptr<T>(xc), opt_ptr<T>(wc), opt_ptr<T>(bc), mutable_ptr<T>(y), d.N, d.C, d.S,
                                   d.G, eps, nullptr, nullptr, torch_parallel()),
                 kOp);
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> group_norm_backward_cpu_impl(
    const at::Tensor& grad, const at::Tensor& x, int64_t num_groups, const std::optional<at::Tensor>& weight,
    double eps) {
  check_call(group_norm_decl(), kOp, {x, num_groups, weight, std::optional<at::Tensor>(), eps, "none"});
  TORCH_CHECK_VALUE(grad.sizes() == x.sizes(), kOp, ": grad must have x's shape ", x.sizes(), ", got ",
                    grad.sizes());
  const GroupNormDims d = group_norm_dims(shape_of(x), num_groups);
  const at::Tensor xc = x.contiguous(), gc = grad.to(x.scalar_type()).contiguous();
  const auto wc = contiguous(weight);
  at::Tensor dx = at::empty_like(xc, at::MemoryFormat::Contiguous);
  at::Tensor dw = at::empty({d.C}, x.options());
  at::Tensor db = at::empty({d.C}, x.options());
  dispatch_float(x.scalar_type(), kOp, [&](auto tag) {
    using T = decltype(tag);
    check_status(group_norm_backward_cpu<T>(ptr<T>(gc), ptr<T>(xc), opt_ptr<T>(wc), mutable_ptr<T>(dx),
                                            mutable_ptr<T>(dw), mutable_ptr<T>(db), d.N, d.C, d.S, d.G, eps,
                                            torch_parallel()),
                 kOp);
  });
  return {dx, dw, db};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opbridge, m) {
  define_op(m, group_norm_decl());
  // Gradients w.r.t. (x, weight, bias); weight/bias gradients are computed as if weight = 1
  // when weight is None, and the caller drops what it does not need.
  m.def("group_norm_backward(Tensor grad, Tensor x, int num_groups, Tensor? weight, float eps) -> "
        "(Tensor, Tensor, Tensor)",
        {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(opbridge, CPU, m) {
  m.impl("group_norm", &group_norm_cpu_impl);
  m.impl("group_norm_backward", &group_norm_backward_cpu_impl);
}

}  // namespace opbridge::torch_adapter
