// torch op opbridge::group_norm: schema (from the declaration, group_norm_decl.cpp) and CPU
// implementation; the fake kernel comes from the declaration too, the autograd formula from
// opbridge/ops/group_norm.py.
//
// Memory format: a contiguous x is [N, C, S]; an x whose memory is channels-last ([N, *spatial,
// C], e.g. torch.channels_last / channels_last_3d, or a rank-3 (N, L, C) buffer seen as
// (N, C, L)) is [N, S, C] and gives an output of the same strides, with no copy; anything else
// is made contiguous first. The fake kernel (opbridge/ops/_declared.py) applies the same rule.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "opbridge/group_norm.h"
#include "torch_common.h"

namespace opbridge::torch_adapter {
namespace {

constexpr const char* kOp = "opbridge::group_norm";

// Shared input validation of forward and backward: the declaration's checks.
Activation check_group_norm(const at::Tensor& x, int64_t num_groups, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, double eps, c10::string_view activation) {
  check_call(group_norm_decl(), kOp, {x, num_groups, weight, bias, eps, activation});
  return activation_from_name(std::string(activation));
}

std::optional<at::Tensor> contiguous(const std::optional<at::Tensor>& t) {
  if (!t.has_value() || !t->defined()) return std::nullopt;
  return t->contiguous();
}

GroupNormDims dims_of(const at::Tensor& x, int64_t num_groups, bool channels_last) {
  return group_norm_dims(x.sizes().data(), x.sizes().size(), num_groups, channels_last);
}

at::Tensor group_norm_cpu_impl(const at::Tensor& x, int64_t num_groups, const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, double eps, c10::string_view activation) {
  const Activation act = check_group_norm(x, num_groups, weight, bias, eps, activation);
  const bool cl = uses_channels_last(x);
  const at::Tensor xc = cl ? x : x.contiguous();
  const GroupNormDims d = dims_of(xc, num_groups, cl);
  const auto wc = contiguous(weight), bc = contiguous(bias);
  at::Tensor y = empty_in_layout(xc, cl);
  dispatch_float(x.scalar_type(), kOp, [&](auto tag) {
    using T = decltype(tag);
    check_status(group_norm_cpu<T>(ptr<T>(xc), opt_ptr<T>(wc), opt_ptr<T>(bc), mutable_ptr<T>(y), d, eps, act,
                                   nullptr, nullptr, torch_parallel()),
                 kOp);
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> group_norm_backward_cpu_impl(
    const at::Tensor& grad, const at::Tensor& x, int64_t num_groups, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, double eps, c10::string_view activation) {
  const Activation act = check_group_norm(x, num_groups, weight, bias, eps, activation);
  TORCH_CHECK_VALUE(grad.sizes() == x.sizes(), kOp, ": grad must have x's shape ", x.sizes(), ", got ",
                    grad.sizes());
  const bool cl = uses_channels_last(x);
  const at::Tensor xc = cl ? x : x.contiguous();
  const at::Tensor gc = in_layout(grad.to(x.scalar_type()), cl);
  const GroupNormDims d = dims_of(xc, num_groups, cl);
  const auto wc = contiguous(weight), bc = contiguous(bias);
  at::Tensor dx = empty_in_layout(xc, cl);
  at::Tensor dw = at::empty({d.C}, x.options());
  at::Tensor db = at::empty({d.C}, x.options());
  dispatch_float(x.scalar_type(), kOp, [&](auto tag) {
    using T = decltype(tag);
    check_status(group_norm_backward_cpu<T>(ptr<T>(gc), ptr<T>(xc), opt_ptr<T>(wc), opt_ptr<T>(bc),
                                            mutable_ptr<T>(dx), mutable_ptr<T>(dw), mutable_ptr<T>(db), d, eps, act,
                                            torch_parallel()),
                 kOp);
  });
  return {dx, dw, db};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opbridge, m) {
  define_op(m, group_norm_decl());
  // Gradients w.r.t. (x, weight, bias); weight/bias gradients are computed as if weight = 1
  // when weight is None, and the caller drops what it does not need. bias enters through the
  // activation's derivative. dx has x's memory format (see group_norm).
  m.def("group_norm_backward(Tensor grad, Tensor x, int num_groups, Tensor? weight, Tensor? bias, float eps, "
        "str activation=\"none\") -> (Tensor, Tensor, Tensor)",
        {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(opbridge, CPU, m) {
  m.impl("group_norm", &group_norm_cpu_impl);
  m.impl("group_norm_backward", &group_norm_backward_cpu_impl);
}

}  // namespace opbridge::torch_adapter
