// torch op opbridge::group_norm: schema (from the declaration, group_norm_decl.cpp) and CPU
// implementation on the stable ABI; the fake kernel comes from the declaration too, the autograd
// formula from opbridge/ops/group_norm.py.
//
// Memory format: a contiguous x is [N, C, S]; an x whose memory is channels-last ([N, *spatial,
// C], e.g. torch.channels_last / channels_last_3d, or a rank-3 (N, L, C) buffer seen as
// (N, C, L)) is [N, S, C] and gives an output of the same strides, with no copy; anything else
// is made contiguous first. The fake kernel (opbridge/ops/_declared.py) applies the same rule.
#include <string>

#include "opbridge/group_norm.h"
#include "torch_common.h"

namespace opbridge::torch_adapter {
namespace {

constexpr const char* kOp = "opbridge::group_norm";
constexpr const char* kBackwardOp = "opbridge::group_norm_backward";

GroupNormDims dims_of(const Tensor& x, int64_t num_groups, bool channels_last) {
  const auto s = x.sizes();
  return group_norm_dims(s.data(), s.size(), num_groups, channels_last);
}

Tensor contiguous_or_undefined(const Tensor& t) { return t.defined() ? contiguous(t) : t; }

void group_norm_cpu_impl(TorchCall& c) {
  const Tensor& x = c.in("x");
  const int64_t num_groups = c.call().attr_int("num_groups");
  const double eps = c.call().attr_float("eps");
  const Activation act = activation_from_name(c.call().attr_string("activation"));
  const bool cl = uses_channels_last(x);
  const Tensor xc = cl ? x : contiguous(x);
  const GroupNormDims d = dims_of(xc, num_groups, cl);
  const Tensor wc = contiguous_or_undefined(c.in("weight")), bc = contiguous_or_undefined(c.in("bias"));
  Tensor y = empty_in_layout(xc, cl);
  dispatch_float(dtype(x), kOp, [&](auto tag) {
    using T = decltype(tag);
    c.check(group_norm_cpu<T>(ptr<T>(xc), opt_ptr<T>(wc), opt_ptr<T>(bc), mutable_ptr<T>(y), d, eps, act, nullptr,
                              nullptr, torch_parallel()));
  });
  c.set_output(0, std::move(y));
}

// group_norm_backward(Tensor grad, Tensor x, int num_groups, Tensor? weight, Tensor? bias, float eps,
// str activation) -> (Tensor dx, Tensor dweight, Tensor dbias): the declaration's checks on the
// forward's arguments, then grad's shape.
void group_norm_backward_cpu_impl(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  const BoxedArgs args(stack, num_args);
  const Tensor grad = args.tensor(0);
  // The forward's arguments, checked by its declaration (messages name opbridge::group_norm).
  TorchCall c(group_norm_decl(), kOp, stack + 1, num_args - 1);
  const Tensor& x = c.in("x");
  check_value(grad.sizes().equals(x.sizes()), kBackwardOp,
              "grad must have x's shape " + shape_string(x) + ", got " + shape_string(grad));
  const int64_t num_groups = c.call().attr_int("num_groups");
  const double eps = c.call().attr_float("eps");
  const Activation act = activation_from_name(c.call().attr_string("activation"));
  const bool cl = uses_channels_last(x);
  const Tensor xc = cl ? x : contiguous(x);
  const Tensor gc = in_layout(to_dtype(grad, dtype(x)), cl);
  const GroupNormDims d = dims_of(xc, num_groups, cl);
  const Tensor wc = contiguous_or_undefined(c.in("weight")), bc = contiguous_or_undefined(c.in("bias"));
  Tensor dx = empty_in_layout(xc, cl);
  Tensor dw = empty({d.C}, dtype(x), x);
  Tensor db = empty({d.C}, dtype(x), x);
  dispatch_float(dtype(x), kBackwardOp, [&](auto tag) {
    using T = decltype(tag);
    check_status(group_norm_backward_cpu<T>(ptr<T>(gc), ptr<T>(xc), opt_ptr<T>(wc), opt_ptr<T>(bc), mutable_ptr<T>(dx),
                                            mutable_ptr<T>(dw), mutable_ptr<T>(db), d, eps, act, torch_parallel()),
                 kBackwardOp);
  });
  (void)num_outputs;
  BoxedArgs::set(stack, 0, dx);
  BoxedArgs::set(stack, 1, dw);
  BoxedArgs::set(stack, 2, db);
}

}  // namespace

OPBRIDGE_TORCH_LIBRARY_FRAGMENT(m) {
  define_op(m, group_norm_decl());
  // Gradients w.r.t. (x, weight, bias); weight/bias gradients are computed as if weight = 1
  // when weight is None, and the caller drops what it does not need. bias enters through the
  // activation's derivative. dx has x's memory format (see group_norm).
  m.def("group_norm_backward(Tensor grad, Tensor x, int num_groups, Tensor? weight, Tensor? bias, float eps, "
        "str activation=\"none\") -> (Tensor, Tensor, Tensor)");
}

OPBRIDGE_TORCH_LIBRARY_IMPL(CPU, m) {
  m.impl("group_norm", OPBRIDGE_DECLARED_KERNEL(group_norm_decl, group_norm_cpu_impl));
  m.impl("group_norm_backward", &group_norm_backward_cpu_impl);
}

}  // namespace opbridge::torch_adapter
