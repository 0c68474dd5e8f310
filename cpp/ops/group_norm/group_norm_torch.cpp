// torch op opbridge::group_norm: schema and CPU implementation (autograd and fake kernels are
// registered from Python, in opbridge/ops/group_norm.py).
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

struct Dims {
  int64_t N, C, S;
};

// Shared input validation of forward and backward: returns the [N, C, S] view of x.
Dims check_group_norm(const at::Tensor& x, int64_t num_groups, const std::optional<at::Tensor>& weight,
                      const std::optional<at::Tensor>& bias, double eps) {
  check_float_dtype(x, kOp, "x");
  check_param(weight, x, kOp, "weight");
  check_param(bias, x, kOp, "bias");
  const auto len = [](const std::optional<at::Tensor>& p) {
    return p.has_value() && p->defined() ? p->numel() : int64_t{-1};
  };
  check_status(group_norm_check(x.dim(), x.dim() >= 2 ? x.size(1) : 0, num_groups, len(weight), len(bias), eps),
               kOp);
  const int64_t N = x.size(0), C = x.size(1);
  // S = 0 for an empty x (the kernels then do nothing); only then could N * C overflow.
  return {N, C, x.numel() == 0 ? 0 : x.numel() / (N * C)};
}

std::optional<at::Tensor> contiguous(const std::optional<at::Tensor>& t) {
  if (!t.has_value() || !t->defined()) return std::nullopt;
  return t->contiguous();
}

at::Tensor group_norm_cpu_impl(const at::Tensor& x, int64_t num_groups, const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, double eps) {
  const Dims d = check_group_norm(x, num_groups, weight, bias, eps);
  const at::Tensor xc = x.contiguous();
  const auto wc = contiguous(weight), bc = contiguous(bias);
  at::Tensor y = at::empty_like(xc, at::MemoryFormat::Contiguous);
  dispatch_float(x.scalar_type(), kOp, [&](auto tag) {
    using T = decltype(tag);
    check_status(group_norm_cpu<T>(ptr<T>(xc), opt_ptr<T>(wc), opt_ptr<T>(bc), mutable_ptr<T>(y), d.N, d.C, d.S,
                                   num_groups, eps, nullptr, nullptr, torch_parallel()),
                 kOp);
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> group_norm_backward_cpu_impl(
    const at::Tensor& grad, const at::Tensor& x, int64_t num_groups, const std::optional<at::Tensor>& weight,
    double eps) {
  const Dims d = check_group_norm(x, num_groups, weight, std::nullopt, eps);
  TORCH_CHECK_VALUE(grad.sizes() == x.sizes(), kOp, ": grad must have x's shape ", x.sizes(), ", got ",
                    grad.sizes());
  const at::Tensor xc = x.contiguous(), gc = grad.to(x.scalar_type()).contiguous();
  const auto wc = contiguous(weight);
  at::Tensor dx = at::empty_like(xc, at::MemoryFormat::Contiguous);
  at::Tensor dw = at::empty({d.C}, x.options());
  at::Tensor db = at::empty({d.C}, x.options());
  dispatch_float(x.scalar_type(), kOp, [&](auto tag) {
    using T = decltype(tag);
    check_status(group_norm_backward_cpu<T>(ptr<T>(gc), ptr<T>(xc), opt_ptr<T>(wc), mutable_ptr<T>(dx),
                                            mutable_ptr<T>(dw), mutable_ptr<T>(db), d.N, d.C, d.S, num_groups,
                                            eps, torch_parallel()),
                 kOp);
  });
  return {dx, dw, db};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opbridge, m) {
  m.def("group_norm(Tensor x, int num_groups, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) -> Tensor",
        {at::Tag::pt2_compliant_tag});
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
