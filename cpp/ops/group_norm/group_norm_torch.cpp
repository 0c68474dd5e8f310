// torch op opbridge::group_norm: schema and CPU implementation (autograd and fake kernels are
// registered from Python, in opbridge/ops/group_norm.py).
//
// Memory format: a contiguous x is [N, C, S]; an x whose memory is channels-last ([N, *spatial,
// C], e.g. torch.channels_last / channels_last_3d, or a rank-3 (N, L, C) buffer seen as
// (N, C, L)) is [N, S, C] and gives an output of the same strides, with no copy; anything else
// is made contiguous first. The fake kernel (opbridge/ops/group_norm.py) applies the same rule.
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

// Shared input validation of forward and backward.
Activation check_group_norm(const at::Tensor& x, int64_t num_groups, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, double eps, c10::string_view activation) {
  Activation act = Activation::kNone;
  check_status(parse_activation(std::string(activation), &act), kOp);
  check_float_dtype(x, kOp, "x");
  check_param(weight, x, kOp, "weight");
  check_param(bias, x, kOp, "bias");
  const auto len = [](const std::optional<at::Tensor>& p) {
    return p.has_value() && p->defined() ? p->numel() : int64_t{-1};
  };
  check_status(group_norm_check(x.dim(), x.dim() >= 2 ? x.size(1) : 0, num_groups, len(weight), len(bias), eps),
               kOp);
  return act;
}

// (0, 2, ..., rank - 1, 1): x.permute(this) is [N, *spatial, C].
std::vector<int64_t> channels_last_order(int64_t rank) {
  std::vector<int64_t> p{0};
  for (int64_t i = 2; i < rank; ++i) p.push_back(i);
  p.push_back(1);
  return p;
}

// Whether x is processed as [N, S, C]: its memory is channels-last and it is not also
// contiguous (where both hold, e.g. C = 1 or all spatial dims 1, the two views coincide).
bool use_channels_last(const at::Tensor& x) {
  return x.dim() >= 3 && !x.is_contiguous() && x.permute(channels_last_order(x.dim())).is_contiguous();
}

// A new tensor of x's sizes, channels-last (strides of a contiguous [N, *spatial, C] buffer) or
// contiguous.
at::Tensor empty_in_layout(const at::Tensor& x, bool channels_last) {
  if (!channels_last) return at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  const auto order = channels_last_order(x.dim());
  std::vector<int64_t> sizes;
  for (int64_t i : order) sizes.push_back(x.size(i));
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) inverse[order[i]] = static_cast<int64_t>(i);
  return at::empty(sizes, x.options()).permute(inverse);
}

// t with x's layout (a copy only where t's memory differs).
at::Tensor in_layout(const at::Tensor& t, bool channels_last) {
  if (!channels_last) return t.contiguous();
  if (t.permute(channels_last_order(t.dim())).is_contiguous()) return t;
  at::Tensor out = empty_in_layout(t, true);
  out.copy_(t);
  return out;
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
  const bool cl = use_channels_last(x);
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
  const bool cl = use_channels_last(x);
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
  m.def("group_norm(Tensor x, int num_groups, Tensor? weight=None, Tensor? bias=None, float eps=1e-05, "
        "str activation=\"none\") -> Tensor",
        {at::Tag::pt2_compliant_tag});
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
